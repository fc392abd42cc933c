"""Losses, advantages and the off-policy correction against the values their
docstrings work out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rl.learner.advantages import group_relative, leave_one_out
from rl.learner.correction import Correction, correct
from rl.learner.losses import CISPO, DAPO, GRPO, GSPO, SFT, DrGRPO, LossInputs


def _inputs(logp: list[list[float]], old: list[list[float]], mask: list[list[float]], adv: list[float]) -> LossInputs:
    lp = torch.tensor(logp, requires_grad=True)
    return LossInputs(
        logp=lp,
        old_logp=torch.tensor(old),
        behaviour_logp=torch.tensor(old),
        mask=torch.tensor(mask),
        advantages=torch.tensor(adv),
        weights=torch.ones(len(logp), len(logp[0])),
    )


def test_advantages_match_the_hand_computed_values() -> None:
    r, g = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.5]), torch.tensor([7, 7, 7, 7, 9, 9])
    assert group_relative(r, g).tolist()[:4] == pytest.approx([1.732, -0.577, -0.577, -0.577], abs=1e-3)
    assert group_relative(r, g, std=False).tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, 0, 0])
    assert leave_one_out(r, g).tolist() == pytest.approx([1, -1 / 3, -1 / 3, -1 / 3, 0, 0])
    assert group_relative(r, g).tolist()[4:] == [0.0, 0.0]  # no variance, no signal


def test_grpo_is_a_token_mean_per_sample_then_a_sample_mean() -> None:
    x = _inputs([[-1.0, -2.0]], [[-1.0, -2.0]], [[1, 1]], [1.0])
    out = GRPO().compute(x)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-1.0)
    assert x.logp.grad.tolist() == [[pytest.approx(-0.5), pytest.approx(-0.5)]]


def test_dr_grpo_divides_by_a_constant_not_by_lengths() -> None:
    x = _inputs([[-1.0, -1.0], [-1.0, -1.0]], [[-1.0, -1.0], [-1.0, -1.0]], [[1, 1], [1, 0]], [1.0, -1.0])
    assert DrGRPO(max_tokens=4).compute(x).loss.item() == pytest.approx(-0.125)
    r = torch.tensor([1.0, 0.0])
    assert DrGRPO().advantages(r, torch.tensor([0, 0]), torch.tensor([1, 1])).tolist() == [0.5, -0.5]


def test_dapo_clips_higher_and_penalises_overlong_samples() -> None:
    up = _inputs([[math.log(1.5)]], [[0.0]], [[1]], [1.0])
    down = _inputs([[math.log(1.5)]], [[0.0]], [[1]], [-1.0])
    assert DAPO().compute(up).loss.item() == pytest.approx(-1.28)
    assert DAPO().compute(down).loss.item() == pytest.approx(1.5)
    d = DAPO(max_tokens=100, overlong_cache=20)
    assert d.overlong(torch.tensor([50, 80, 90, 100, 120])).tolist() == pytest.approx([0, 0, -0.5, -1.0, -1.0])


def test_gspo_clips_the_sequence_ratio() -> None:
    x = _inputs([[0.2, 0.0]], [[0.0, 0.0]], [[1, 1]], [1.0])
    assert GSPO().compute(x).loss.item() == pytest.approx(-1.0004)


def test_cispo_keeps_every_tokens_gradient() -> None:
    x = _inputs([[-0.7]], [[-0.7]], [[1]], [2.0])
    out = CISPO().compute(x)
    out.loss.backward()
    assert float(x.logp.grad[0, 0]) == pytest.approx(-2.0)
    far = _inputs([[3.0]], [[0.0]], [[1]], [1.0])  # ratio e^3 = 20, clipped to 5, gradient kept
    CISPO().compute(far).loss.backward()
    assert float(far.logp.grad[0, 0]) == pytest.approx(-5.0)


def test_sft_is_the_token_mean_nll() -> None:
    x = _inputs([[math.log(0.5), math.log(0.5), -9.0]], [[0, 0, 0]], [[1, 1, 0]], [0.0])
    assert SFT().compute(x).loss.item() == pytest.approx(math.log(2))


def test_correction_caps_weights_masks_out_of_band_tokens_and_measures_the_mismatch() -> None:
    old = torch.tensor([[0.0, 0.0, 0.0]])
    behaviour = torch.tensor([[0.0, -math.log(3.0), math.log(4.0)]])  # ratios 1, 3, 1/4
    mask = torch.ones(1, 3)
    c = correct(old, behaviour, mask, Correction(tis_cap=2.0, mask="token", band_low=0.5, band_high=2.0))
    assert c.weights.tolist() == [[1.0, 0.0, 0.0]] and c.mask.tolist() == [[1.0, 0.0, 0.0]]
    assert c.masked_frac == pytest.approx(2 / 3)
    k3 = [r - math.log(r) - 1 for r in (1.0, 3.0, 0.25)]
    assert c.mismatch_kl == pytest.approx(sum(k3) / 3, rel=1e-5)
    same = correct(old, old, mask, Correction())
    assert same.mismatch_kl == 0.0 and same.weights.tolist() == [[1.0, 1.0, 1.0]]
    seq = correct(old, behaviour, mask, Correction(mask="sequence"))  # geometric mean 0.91: kept whole
    assert seq.mask.tolist() == [[1.0, 1.0, 1.0]] and seq.weights.tolist()[0][1] == 2.0


def test_an_episode_of_several_samples_weighs_in_its_group_as_one() -> None:
    """An endpoint session whose ids drifted comes as several samples of one
    episode: its group's mean counts it once, and its samples share its
    advantage. Rewards [1 (two samples), 0, 0]: mean 1/3, not 1/2."""
    import numpy as np

    from rl.learner.trainer import episode_advantages
    from rl.store import Sample

    def s(ep: str, reward: float) -> Sample:
        z = np.zeros(3, dtype=np.int32)
        return Sample("t", 5, 0, z, np.ones(3, dtype=np.uint8), z.astype(np.float32), reward, episode_id=ep)

    got = episode_advantages(DrGRPO(), [s("5/0", 1.0), s("5/0", 1.0), s("5/1", 0.0), s("5/2", 0.0)])
    assert got.tolist() == pytest.approx([2 / 3, 2 / 3, -1 / 3, -1 / 3])
    plain = episode_advantages(DrGRPO(), [s("", 1.0), s("", 1.0), s("", 0.0), s("", 0.0)])
    assert plain.tolist() == pytest.approx([0.5, 0.5, -0.5, -0.5])  # no identity: each sample its own

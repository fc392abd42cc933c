"""Off-policy correction against the behaviour log-probs the rollouts
recorded (the generator's), and the mismatch between the two.

    r_t = exp(old_logp_t - behaviour_logp_t)      trainer / generator, per token
    weight_t = min(r_t, tis_cap)                  truncated importance sampling
    mask = "token":    drop tokens with r_t outside [low, high]   (ICEPOP-like)
           "sequence": drop samples whose geometric mean of r leaves the band
    mismatch_kl = token mean of k3 = r - log r - 1  (an estimate of
                  KL(behaviour || trainer) from the behaviour's own samples)

The mismatch is logged every step: it is how a user sees that inference and
training disagree (a different kernel, dtype or weight version). Samples are
stale by design in async mode; the weight corrects for it, the mask drops
what is too far gone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl.learner.config import Correction


@dataclass
class Corrected:
    weights: torch.Tensor
    """[B, T] per-token weights (no grad)."""
    mask: torch.Tensor
    """[B, T] the trained-token mask with out-of-band tokens removed."""
    mismatch_kl: float
    masked_frac: float
    """Share of the trained tokens the band removed."""
    ratio_mean: float
    """Token mean of the ratio trainer / generator, before the cap."""
    ratio_max: float
    """Its largest value on a trained token."""


def correct(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, cfg: Correction) -> Corrected:
    log_r = ((old_logp - behaviour_logp) * mask).detach()
    r = torch.exp(log_r)
    n = mask.sum().clamp(min=1.0)
    mismatch = float(((r - log_r - 1.0) * mask).sum() / n)
    weights = r.clamp(max=cfg.tis_cap) if cfg.tis_cap is not None else torch.ones_like(r)
    keep = torch.ones_like(mask)
    if cfg.mask == "token":
        keep = ((r >= cfg.band_low) & (r <= cfg.band_high)).float()
    elif cfg.mask == "sequence":
        g = torch.exp(log_r.sum(-1) / mask.sum(-1).clamp(min=1.0))
        keep = ((g >= cfg.band_low) & (g <= cfg.band_high)).float()[:, None].expand_as(mask)
    new_mask = mask * keep
    ratio_mean = float((r * mask).sum() / n)
    ratio_max = float((r * mask).max()) if mask.any() else 0.0
    return Corrected(weights * keep, new_mask, mismatch, float(1.0 - new_mask.sum() / n), ratio_mean, ratio_max)

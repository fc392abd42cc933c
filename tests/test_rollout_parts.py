"""The rollout worker's parts on their own: when a group may start (the
gate, against a real store's published versions and given-up groups), and
how complete groups are cut into batches."""

from __future__ import annotations

from pathlib import Path

import torch

from rl.rollout.batches import due
from rl.rollout.gate import gate
from rl.store import Store


def test_the_gate_follows_the_published_version_and_the_given_up_groups(tmp_path: Path) -> None:
    store = Store.of_run(tmp_path)
    gps = 2  # groups per step
    # async, staleness 1, nothing published yet (version 0): rounds 0 and 1 may start
    assert [gate(store, g, gps, False, 1)[0] for g in range(6)] == ["start"] * 4 + ["wait"] * 2
    # sync, version 0: round 0 alone
    assert [gate(store, g, gps, True, 0)[0] for g in range(4)] == ["start", "start", "wait", "wait"]
    store.weights.publish({"w": torch.zeros(2)}, version=1)
    assert [gate(store, g, gps, False, 1)[0] for g in range(8)] == ["start"] * 6 + ["wait"] * 2
    verdict, why = gate(store, 1, gps, True, 0)  # sync: round 0 closed once version 1 is out
    assert verdict == "closed" and "round 0 closed, version 1" in why
    assert gate(store, 2, gps, True, 0)[0] == "start" and gate(store, 4, gps, True, 0)[0] == "wait"
    store.given_up.record(3, "sandbox: lost", "rollout-000000")  # one more group may start in its place
    assert [gate(store, g, gps, False, 1)[0] for g in (6, 7)] == ["start", "wait"]
    assert gate(store, 100, None, True, 0)[0] == "start"  # no steps to follow: every group starts


def test_complete_groups_are_cut_into_whole_batches_and_a_remainder_waits_unless_partial() -> None:
    assert due(list("abcde"), 2, partial=False) == ([["a", "b"], ["c", "d"]], ["e"])
    assert due(list("abcde"), 2, partial=True) == ([["a", "b"], ["c", "d"], ["e"]], [])
    assert due(list("a"), 4, partial=False) == ([], ["a"])
    assert due([], 4, partial=True) == ([], [])

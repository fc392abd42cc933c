"""rl.curves.Writer: the one TensorBoard writer of every role."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from rl.curves import Writer


def test_the_writer_draws_where_tensorboard_is_and_warns_and_draws_nothing_where_it_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    w = Writer(tmp_path / "on", "the test")
    assert w.enabled
    for step in (1, 2, 3):
        w.add_scalar("x/y", step * 0.5, step)
    w.close()
    # resumed at step 2: the points a killed predecessor drew from step 2 on are dropped
    again = Writer(tmp_path / "on", "the test", purge_step=2)
    again.add_scalar("x/y", 9.0, 2)
    again.close()
    ea = EventAccumulator(str(tmp_path / "on"))
    ea.Reload()
    assert [(e.step, e.value) for e in ea.Scalars("x/y")] == [(1, 0.5), (2, 9.0)]

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    with caplog.at_level(logging.WARNING):
        off = Writer(tmp_path / "off", "the test")
    assert not off.enabled and "no curves for the test" in caplog.text
    off.add_scalar("x/y", 1.0, 1)
    off.add_histogram("x/h", [1.0, 2.0], 1)
    off.flush()
    off.close()
    assert not (tmp_path / "off").exists()

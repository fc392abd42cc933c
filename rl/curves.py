"""The one TensorBoard writer every role draws its curves with.

`Writer(folder, whose)` is torch's SummaryWriter where TensorBoard is
installed, and otherwise writes nothing (a warning says whose curves are
missing): a role never fails for want of curves, and no role checks for it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("sarl")


class Writer:
    def __init__(self, folder: Path, whose: str, purge_step: int | None = None):
        """`purge_step`: a resumed writer drops the points a killed
        predecessor wrote from this step on (they are drawn again)."""
        self._tb: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            log.warning("tensorboard is not installed: no curves for %s", whose)
        else:
            self._tb = SummaryWriter(str(folder), purge_step=purge_step)

    @property
    def enabled(self) -> bool:
        return self._tb is not None

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        if self._tb is not None:
            self._tb.add_scalar(tag, value, step)

    def add_histogram(self, tag: str, values: Any, step: int) -> None:
        if self._tb is not None:
            self._tb.add_histogram(tag, values, step)

    def flush(self) -> None:
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()

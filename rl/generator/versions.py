"""Which weight version a generator serves: the newest that loads.

At start the engine loads the newest version in the store; one that is
refused (corrupt, missing, not fitting the model: the engine raises
`StoreError` before any weight changed) is recorded in the task's state
and the one before it is tried. While serving, a newer version is swapped
into the live engine between batches; a refused one leaves the old
weights serving. A version is pinned while it loads, so that retention
does not delete it under the engine.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rl.context import RunContext
from rl.store import StoreError

log = logging.getLogger("sarl.generator")


class Versions:
    def __init__(self, ctx: RunContext, weights: Any):
        self.ctx, self.weights = ctx, weights
        self.holder = f"generator-{ctx.task}"
        self.refused: set[int] = set()
        """Refused by this process (a restart tries them again); the task's
        state keeps every refusal with its reason."""
        self.loaded: int | None = None
        """None: the base checkpoint, served as version 0."""
        self.swaps: list[dict[str, Any]] = list(ctx.state.get("swaps", []))

    def _refuse(self, version: int, e: StoreError) -> None:
        self.refused.add(version)
        self.ctx.save(refused={**self.ctx.state.get("refused", {}), str(version): str(e)})

    def load_newest(self, engine: Any) -> None:
        """At start: the newest version that loads, else the base checkpoint."""
        store = str(self.ctx.layout.store_path)
        for version in reversed(self.weights.versions()):
            try:
                with self.weights.pinned_while(self.holder, version):
                    engine.load_version(store, version)
            except StoreError as e:  # raised before any weight changed: try the one before
                log.error("weight version %d refused: %s", version, e)
                self._refuse(version, e)
                continue
            self.loaded = version
            return

    def swap_newer(self, server: Any, served: int) -> float | None:
        """Load a newer published version into the live engine; the seconds
        it held requests, or None when there was none to load."""
        latest = self.weights.latest()
        if latest is None or (self.loaded is not None and latest <= self.loaded) or latest in self.refused:
            return None
        try:
            with self.weights.pinned_while(self.holder, latest):
                held: float = server.swap(str(self.ctx.layout.store_path), latest)
        except StoreError as e:  # raised before any weight changed: serve on with the old ones
            log.error("weight version %d refused, still serving %s: %s", latest, self.loaded, e)
            self._refuse(latest, e)
            return None
        self.loaded = latest
        log.info("loaded weight version %d (requests held %.2f s)", latest, held)
        self.swaps = [*self.swaps, {"version": latest, "held_s": round(held, 3), "at": time.time()}][-20:]
        self.ctx.save(version=latest, served=served, swaps=self.swaps)
        return held

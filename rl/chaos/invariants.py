"""What must hold after a run, however often it was harmed: read from the
store and the run directory, never from logs.

* every committed batch is consumed exactly once by the learner (or
  quarantined with a reason);
* every episode identity (`group/index`) of the run is committed once, or
  its group is recorded as abandoned with a reason;
* the learner's steps are 1..N, each applied once, and version N is
  published; N is the configured steps, or fewer with the reason the
  learner recorded (groups dropped for staleness leave too few samples);
* every generator ended on the newest version;
* no TensorBoard curve's steps go backwards within a writer, the purges a
  resumed learner asks for (`purge_step`) honoured as TensorBoard honours
  them. Read from the raw event files: TensorBoard's own reader silently
  drops points that go backwards, which would hide the fault.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl.fsio import read_json
from rl.rollout.config import RolloutRole
from rl.run.rundir import RunDir


@dataclass
class Ledger:
    batches_committed: int = 0
    batches_lost: int = 0
    """Committed, neither consumed nor quarantined."""
    batches_duplicated: int = 0
    """Consumed more than once (extra consumptions)."""
    batches_quarantined: int = 0
    episodes_committed: int = 0
    episodes_lost: int = 0
    """Neither committed nor in an abandoned group."""
    episodes_duplicated: int = 0
    groups_abandoned: dict[str, str] = field(default_factory=dict)
    """group -> the recorded reason."""
    steps: list[int] = field(default_factory=list)
    """The learner's applied steps, in order."""
    learner_ended: str = ""
    """Why the learner ended before its configured steps (empty: it did not).
    Groups dropped for staleness can leave a last step short of samples."""
    problems: list[str] = field(default_factory=list)
    """Every broken invariant, in words."""

    @property
    def lost(self) -> int:
        return self.batches_lost + self.episodes_lost

    @property
    def duplicated(self) -> int:
        return self.batches_duplicated + self.episodes_duplicated


def check(run_dir: Path) -> Ledger:
    """The run's ledger against the exactly-once rules: every committed batch
    consumed once, learner steps 1..n once each, every episode committed once
    or its group abandoned with a reason, generators on the newest version,
    and no TensorBoard curve going back."""
    from rl.learner.checkpoints import LearnerCheckpoints
    from rl.store import Store

    rd = RunDir(run_dir)
    cfg = rd.config()
    v = Ledger()
    store = Store.of_run(run_dir)
    reader = store.reader()
    committed = reader.committed()
    v.batches_committed = len(committed)
    ck = LearnerCheckpoints(run_dir).latest()
    history: list[list[Any]] = ck.meta.get("history", []) if ck is not None else []
    learner = read_json(rd.state_path("learner", 0)) or {}
    latest = store.weights.latest() or 0
    _batches(v, {f"{w}/{s}" for w, s in committed}, history, set(learner.get("quarantined", {})))
    _steps(v, history, str(learner.get("ended", "")), cfg.learner.steps if cfg.learner else 0)
    if cfg.learner is not None and latest != len(v.steps):
        v.problems.append(f"the newest published version is {latest}, the last step applied {len(v.steps)}")
    if cfg.rollout is not None:
        episodes: Counter[str] = Counter()
        for key in committed:
            episodes.update(reader.info(key).episode_ids)
        _episodes(v, rd, episodes, cfg.rollout)
    if cfg.generator is not None and cfg.learner is not None:  # generators on the newest version
        for t in range(cfg.generator.workers):
            st = read_json(rd.state_path("generator", t)) or {}
            if st.get("version") != latest:
                v.problems.append(f"generator task {t} ended on version {st.get('version')}, the newest is {latest}")
    v.problems += tensorboard_backwards(rd.curves_path)
    return v


def _batches(v: Ledger, keys: set[str], history: list[list[Any]], quarantined: set[str]) -> None:
    """Committed batches: consumed once each, or quarantined."""
    consumed = Counter(k for _, ks in history for k in ks)
    v.batches_quarantined = len(quarantined & keys)
    v.batches_duplicated = sum(n - 1 for n in consumed.values())
    v.batches_lost = len(keys - set(consumed) - quarantined)
    if v.batches_duplicated:
        v.problems.append(f"{v.batches_duplicated} batch consumptions were repeats")
    if v.batches_lost:
        v.problems.append(f"{v.batches_lost} committed batches were never consumed: {sorted(keys - set(consumed))[:5]}")
    if set(consumed) - keys:
        v.problems.append(f"the learner consumed batches the store does not hold: {sorted(set(consumed) - keys)[:5]}")


def _steps(v: Ledger, history: list[list[Any]], ended: str, planned: int) -> None:
    """Learner steps 1..n, each once; n short of `planned` only with the
    reason the learner recorded."""
    v.steps = [int(s) for s, _ in history]
    n = len(v.steps)
    if v.steps != list(range(1, n + 1)):
        v.problems.append(f"learner steps applied {v.steps}: a step skipped or repeated")
    v.learner_ended = ended
    if n < planned and not v.learner_ended:
        v.problems.append(f"the learner stopped at step {n} of {planned} without a recorded reason")


def _episodes(v: Ledger, rd: RunDir, episodes: Counter[str], rc: RolloutRole) -> None:
    """Episodes: committed once, or their group abandoned with a reason."""
    for t in range(rc.workers):
        for g, why in (read_json(rd.state_path("rollout", t)) or {}).get("abandoned", {}).items():
            v.groups_abandoned[str(g)] = str(why)
    want_ids = {f"{g}/{i}" for g in range(rc.groups) if str(g) not in v.groups_abandoned for i in range(rc.group_size)}
    v.episodes_committed = len(episodes)
    v.episodes_duplicated = sum(n - 1 for n in episodes.values())
    v.episodes_lost = len(want_ids - set(episodes))
    if v.episodes_lost:
        v.problems.append(f"{v.episodes_lost} episodes neither committed nor abandoned: "
                          f"{sorted(want_ids - set(episodes))[:5]}")  # fmt: skip
    if v.episodes_duplicated:
        v.problems.append(f"{v.episodes_duplicated} episodes committed more than once")
    if not all(v.groups_abandoned.values()):
        v.problems.append("a group was abandoned without a reason")


def tensorboard_backwards(tb_root: Path) -> list[str]:
    """Every scalar whose step went backwards within its writer folder."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out: list[str] = []
    if not tb_root.is_dir():
        return out
    for folder in sorted(p for p in tb_root.iterdir() if p.is_dir()):
        last: dict[str, int] = {}
        for path in sorted(folder.glob("events.out.tfevents.*")):  # the name starts with its creation time
            for event in EventFileLoader(str(path)).Load():
                if event.HasField("file_version") and event.step > 0:  # a writer opened with purge_step
                    last = {tag: min(s, event.step - 1) for tag, s in last.items()}
                if not event.HasField("summary"):
                    continue
                for value in event.summary.value:
                    if not value.HasField("simple_value") and value.metadata.plugin_data.plugin_name != "scalars":
                        continue
                    if event.step < last.get(value.tag, -1):
                        out.append(f"tb/{folder.name} {value.tag}: step {event.step} after step {last[value.tag]}")
                    last[value.tag] = max(event.step, last.get(value.tag, -1))
    return out

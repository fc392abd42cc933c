"""`sarl chaos RUN.toml`: a real run on the local Slurm, harmed on purpose,
then checked.

1. The baseline: the run once without faults (`--no-baseline` skips it),
   for the throughput ratio.
2. The same run again, with recovery on (`CHAOS_RECOVERY`). Once the
   learner has taken its first step (every role is up), `--injections`
   faults are done one after another, each after a random pause
   (`--gap`), to a task chosen at random among those running
   (rl.chaos.faults). The kinds are drawn round-robin in a seeded random
   order, so that every kind comes before any comes twice. After each,
   chaos waits until it is healed, and records how long that took.
3. The run finishes its configured steps by itself; then the invariants
   are checked from the store and the run directory (rl.chaos.invariants).

The figures: injections by kind, recovery time (p50, max), episodes and
batches lost and duplicated, and trained samples per second against the
baseline's. The exit status is 1 when anything was lost or duplicated, an
invariant broke, or a fault was not healed within `--heal-timeout`.

Not covered: faults to the login node (this process) or to the shared
filesystem; two faults at once (each is healed before the next).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rl.errors import SarlError

CHAOS_RECOVERY = {
    "enabled": True, "check_s": 2.0, "beat_s": 1.0, "hung_s": 15.0, "stall_s": 180.0, "max_restarts": 1000,
}  # fmt: skip
"""Recovery for the harmed run: quick looks, a stall bound above a learner's
start on 2 busy cores, and no crash-loop limit to speak of (every death
here is an injected one, not a crash loop)."""


def _config(src: Path) -> dict[str, Any]:
    from rl.config import load_config, to_plain

    cfg = load_config(src, cluster="slurm")  # relative paths from here, as `sarl submit` reads them
    missing = [r for r in ("generator", "rollout", "learner") if getattr(cfg, r) is None]
    if missing:
        raise SarlError(f"{src}: chaos harms a whole run; add the missing sections: {', '.join(missing)}")
    return to_plain(cfg)


def _submit(work: Path, plain: dict[str, Any], name: str, recovery: dict[str, Any] | None) -> tuple[Path, float]:
    import tomli_w

    plain = json.loads(json.dumps(plain))
    plain["run"].update(name=name, root=str(work / "runs"))
    if recovery is not None:
        plain["run"]["recovery"] = {**plain["run"].get("recovery", {}), **recovery}
    path = work / f"{name}.toml"
    path.write_text(tomli_w.dumps(plain))
    sarl = str(Path(sys.executable).with_name("sarl"))
    t0 = time.time()
    out = subprocess.run([sarl, "submit", str(path), "--cluster", "slurm"], cwd=work, capture_output=True, text=True)
    if out.returncode != 0:
        raise SarlError(f"chaos: sarl submit of the {name} run failed:\n{out.stderr[-2000:]}")
    return work / "runs" / name, t0


def _state(run: Path, role: str, task: int = 0) -> dict[str, Any]:
    from rl.fsio import read_json
    from rl.run.rundir import RunDir

    return read_json(RunDir(run).state_path(role, task)) or {}


def _wait(pred: Any, timeout: float, what: str) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return time.time()
        time.sleep(0.5)
    raise SarlError(f"chaos: timed out after {timeout:.0f} s waiting for {what}")


def _run_over(run: Path) -> bool:
    """The learner, and every rollout and generator task, done."""
    from rl.run.rundir import RunDir

    rd = RunDir(run)
    return all(rd.all_done(r) for r in ("learner", "rollout", "generator"))


def _cancel(run: Path) -> None:
    """Cancel the run and wait until none of its jobs is in the queue (a
    task that has written `done` may still be exiting; the harmed run must
    not share the node with the baseline's last processes)."""
    sarl = str(Path(sys.executable).with_name("sarl"))
    subprocess.run([sarl, "cancel", str(run)], capture_output=True)
    from rl.run.rundir import RunDir

    cfg = RunDir(run).config()
    names = ",".join(f"sarl-{cfg.run.name}-{role}" for role in cfg.roles())

    def jobs() -> list[str]:
        out = subprocess.run(["squeue", "-h", "-n", names, "-o", "%i"], capture_output=True, text=True)
        return out.stdout.split()

    with contextlib.suppress(SarlError):
        _wait(lambda: not jobs(), 60, "the run's jobs to leave the queue")
        return
    subprocess.run(["scancel", *jobs()], capture_output=True)  # a task that sarl cancel saw as done
    _wait(lambda: not jobs(), 120, f"the jobs of {run.name} to leave the queue after scancel")


def _rate(plain: dict[str, Any], t0: float, t1: float) -> float:
    lc = plain["learner"]
    return lc["steps"] * lc["samples_per_step"] / max(t1 - t0, 1e-9)


def chaos(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """A run harmed by `--injections` faults of every kind in turn (the
    order shuffled by `--seed`), then checked against the exactly-once rules;
    with `--baseline`, the same run unharmed first, for the throughput ratio."""
    from rl.chaos.invariants import check

    if args.injections < 0:
        raise SarlError(f"chaos: --injections {args.injections}: must be >= 0")
    plain = _config(Path(args.config))
    if shutil.which("sbatch") is None or subprocess.run(["sinfo", "-h"], capture_output=True).returncode != 0:
        raise SarlError("chaos: needs a running Slurm (sbatch, sinfo): it harms a real run on it")
    work = Path(args.dir).resolve() if args.dir else Path(tempfile.mkdtemp(prefix="sarl-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    if (work / "runs").exists():
        raise SarlError(f"chaos: {work}/runs exists: give a new --dir")
    r: dict[str, Any] = {"config": str(args.config), "dir": str(work), "seed": args.seed}
    if args.baseline:
        run, t0 = _submit(work, plain, "base", None)
        try:
            t1 = _wait(lambda: _state(run, "learner").get("done"), args.timeout, "the baseline's learner")
            _wait(lambda: _run_over(run), 600, "the baseline run to end")
        finally:
            _cancel(run)
        r["base_samples_s"] = round(_rate(plain, t0, t1), 4)
    run, t0 = _submit(work, plain, "chaos", CHAOS_RECOVERY)
    try:
        faults, skipped = _harm(run, args)
        t1 = _wait(lambda: _state(run, "learner").get("done"), args.timeout, "the harmed run's learner")
        _wait(lambda: _run_over(run), 600, "the harmed run to end")
    finally:
        _cancel(run)
    r.update(_ledger(faults, skipped, check(run), t0))
    r["chaos_samples_s"] = round(_rate(plain, t0, t1), 4)
    r["throughput_ratio"] = round(r["chaos_samples_s"] / r["base_samples_s"], 3) if args.baseline else None
    r["ok"] = not (r["problems"] or r["lost"] or r["duplicated"] or r["unhealed"])
    return r, _lines(r)


def _harm(run: Path, args: argparse.Namespace) -> tuple[list[Any], Counter[str]]:
    """Inject the faults, each after a random gap, and wait for each to heal
    (one not healed in time is reported, not raised). Returns the faults
    injected, and the kinds skipped (the run was over, or no task fitted)."""
    from tqdm import tqdm

    from rl.chaos.faults import KINDS, Fault, healed, inject
    from rl.run.rundir import RunDir

    rng = random.Random(args.seed)
    order: list[str] = []
    while len(order) < args.injections:
        kinds = list(KINDS)
        rng.shuffle(kinds)
        order += kinds
    order = order[: args.injections]
    rd = RunDir(run)
    faults: list[Fault] = []
    skipped: Counter[str] = Counter()
    with tqdm(total=len(order), desc="chaos (faults injected and healed)", file=sys.stderr) as bar:
        _wait(lambda: _state(run, "learner").get("step", 0) >= 1, args.timeout, "the learner's first step")
        for kind in order:
            time.sleep(rng.uniform(*args.gap))
            if _state(run, "learner").get("done"):
                skipped[kind] += 1  # the run is over: nothing left to harm
                continue
            fault = None
            for _ in range(10):  # no fitting task this moment (all restarting): try again shortly
                fault = inject(rd, kind, rng)
                if fault is not None:
                    break
                time.sleep(1.0)
            if fault is None:
                skipped[kind] += 1
                continue
            faults.append(fault)
            with contextlib.suppress(SarlError):  # not healed in time: reported below
                fault.healed_at = _wait(lambda f=fault: healed(rd, f), args.heal_timeout, f"{kind} to heal")
            bar.update(1)
    return faults, skipped


def _ledger(faults: list[Any], skipped: Counter[str], verdict: Any, t0: float) -> dict[str, Any]:
    """The faults, how long each took to heal, and the run's ledger."""
    times = sorted(f.recovery_s for f in faults if f.recovery_s is not None)
    return dict(
        injections=len(faults),
        kinds=dict(Counter(f.kind for f in faults)),
        skipped=dict(skipped),
        unhealed=[f"{f.kind} {f.role}: {f.detail}" for f in faults if f.healed_at is None],
        lost=verdict.lost,
        duplicated=verdict.duplicated,
        batches_lost=verdict.batches_lost,
        batches_duplicated=verdict.batches_duplicated,
        episodes_lost=verdict.episodes_lost,
        episodes_duplicated=verdict.episodes_duplicated,
        batches_committed=verdict.batches_committed,
        episodes_committed=verdict.episodes_committed,
        groups_abandoned=verdict.groups_abandoned,
        steps_applied=len(verdict.steps),
        learner_ended=verdict.learner_ended,
        recovery_p50_s=round(statistics.median(times), 1) if times else None,
        recovery_max_s=round(times[-1], 1) if times else None,
        problems=verdict.problems,
        faults=[
            {
                "kind": f.kind,
                "role": f.role,
                "detail": f.detail,
                "at_s": round(f.at - t0, 1),  # seconds after the harmed run's submission
                "recovery_s": None if f.recovery_s is None else round(f.recovery_s, 1),
            }
            for f in faults
        ],  # fmt: skip
    )


def _lines(r: dict[str, Any]) -> list[str]:
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(r["kinds"].items()))
    ratio = "no baseline" if r["throughput_ratio"] is None else f"{r['throughput_ratio']} of the baseline's"
    out = [
        f"chaos: {r['injections']} faults injected ({kinds}); run in {r['dir']}",
        f"  recovery: p50 {r['recovery_p50_s']} s, max {r['recovery_max_s']} s; not healed: {len(r['unhealed'])}",
        f"  lost {r['lost']} (batches {r['batches_lost']}, episodes {r['episodes_lost']}), "
        f"duplicated {r['duplicated']} (batches {r['batches_duplicated']}, episodes {r['episodes_duplicated']}); "
        f"{r['batches_committed']} batches, {r['episodes_committed']} episodes committed, "
        f"{len(r['groups_abandoned'])} groups abandoned with a reason",
        f"  throughput: {r['chaos_samples_s']} samples/s, {ratio}; learner steps applied {r['steps_applied']}"
        + (f" (ended early: {r['learner_ended']})" if r["learner_ended"] else ""),
    ]
    out += [f"  {f['kind']:<8} {f['role']:<10} {f['recovery_s']!s:>6} s  {f['detail']}" for f in r["faults"]]
    out += [f"  BROKEN: {p}" for p in r["problems"]] + [f"  NOT HEALED: {u}" for u in r["unhealed"]]
    out.append("  invariants hold" if r["ok"] else "  FAILED")
    return out

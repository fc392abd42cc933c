"""What both chains of `sarl bench learn` share (rl.bench.heldout_gain on
functions, rl.bench.tool_gain on tool kinds): the runner of their `sarl`
commands, the stages they evaluate and the differences they report."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from rl.errors import SarlError
from rl.layout import RunLayout


class Steps:
    """Runs `sarl` commands in `work`, each one's output in logs/NN-name.txt."""

    def __init__(self, work: Path):
        self.work, self.n = work, 0
        (work / "logs").mkdir(parents=True, exist_ok=True)
        self.sarl = str(Path(sys.executable).with_name("sarl"))

    def __call__(self, name: str, *args: str, ok: tuple[int, ...] = (0,)) -> str:
        self.n += 1
        log = self.work / "logs" / f"{self.n:02d}-{name}.txt"
        print(f"bench learn: sarl {' '.join(args)}", file=sys.stderr, flush=True)
        p = _start([self.sarl, *args], self.work)
        try:
            stdout, stderr = p.communicate()
        except BaseException:  # Ctrl-C or SIGTERM (SystemExit): the command ends as on its own
            _end(p)  # SIGKILL would leave an evaluation's engine processes behind
            raise
        log.write_text(f"$ sarl {' '.join(args)}\n{stdout}\n--- stderr\n{stderr}")
        if p.returncode not in ok:
            tail = "\n".join((stderr.strip() or stdout.strip()).splitlines()[-15:])
            raise SarlError(f"bench learn: `sarl {' '.join(args)}` failed ({log}):\n{tail}")
        return stdout

    def run_to_end(self, name: str, run: Path, *submit: str) -> None:
        """`sarl submit SUBMIT...`, then `sarl status RUN --wait`. The run's
        roles are detached processes: if the wait does not end with the run
        (Ctrl-C, SIGTERM, a failed task), the run is cancelled, so no role of
        the benchmark outlives it."""
        self(f"submit-{name}", "submit", *submit)
        try:
            self(f"wait-{name}", "status", str(run), "--wait")
        except BaseException:
            subprocess.run([self.sarl, "cancel", str(run)], cwd=self.work, capture_output=True, timeout=120)
            raise

    def evals(
        self,
        run: str,
        tasks: list[str],
        version: int | None,
        samplings: list[tuple[int, float | None]],
        extra: list[str],
    ) -> list[dict[str, Any]]:
        """One `sarl eval` (one engine start) of every file with every sampling
        (n, temperature): n samples a task at the temperature; None: greedy
        when n = 1, else T = 1, where sampled pass@1 is defined. The
        summaries, files outer, samplings inner."""
        ns = [str(n) for n, _ in samplings]
        ats = [str(t) if t is not None else "0" if n == 1 else "1" for n, t in samplings]
        args = ["eval", run, "--tasks", *tasks, "-n", *ns, "--temperature", *ats, "--json", *extra]
        if version is not None:
            args += ["--version", str(version)]
        modes = "+".join(
            "greedy" if n == 1 and t is None else f"n{n}" + (f"-t{t}" if t is not None else "") for n, t in samplings
        )
        name = f"eval-{Path(run).name}-{'+'.join(Path(t).stem for t in tasks)}-{modes}"
        out = json.loads(self(name, *args))
        got = out if isinstance(out, list) else [out]
        expected = [(Path(t).name, n) for t in tasks for n, _ in samplings]
        if [(Path(g["tasks_file"]).name, g["n"]) for g in got] != expected:  # each figure read as the play it is
            raise SarlError(f"bench learn: `sarl eval` gave plays {[(g['tasks_file'], g['n']) for g in got]}, "
                            f"not {expected}")  # fmt: skip
        return got


def _start(argv: list[str], cwd: Path) -> subprocess.Popen[str]:
    """A command in a process group of its own, so that `_end` reaches the
    processes it started (an evaluation's vLLM engine) as well as itself."""
    return subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)  # fmt: skip


def _end(p: subprocess.Popen[str], grace_s: float = 60.0) -> None:
    """SIGTERM to the command, which every `sarl` command takes as an exit
    (its engines and sandboxes closed on the way out); after `grace_s`,
    SIGKILL to its whole process group, so that no engine process it started
    outlives it. Not covered: a process that left the group (setsid)."""
    p.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(grace_s)
    with contextlib.suppress(ProcessLookupError):  # the group outlives its leader; empty, it is gone
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()


STAGES = ("base", "sft", "rl", "control")
"""What is evaluated: the base model, the SFT warm start, SFT + RL, and SFT +
RL with each step's rewards shuffled among its samples (the control)."""
GAINS = (("sft", "base"), ("rl", "sft"), ("rl", "control"))
"""The paired differences reported: what the warm start gave, what RL gave
on top of it, and what RL gave beyond the same updates on shuffled rewards."""
EVALUATED: dict[str, tuple[str, int | None]] = {
    "base": ("sft", 0),  # the SFT run's version 0: the base model
    "sft": ("rl", 0),  # the RL run's version 0: the exported warm start it began from
    "rl": ("rl", None),  # the newest version
    "control": ("control", None),
}
EVAL_KEYS = ("tasks", "pass@1", "se@1", "reward_mean", "reward_se", "crash_share", "turn_2_share", "turn_2_fix_rate")


def fresh_work(work: Path, runs: dict[str, Path]) -> Steps:
    """The benchmark's folder, made new: a --dir or a run that exists is
    refused before anything is made (a run there would be resumed, not
    measured)."""
    if work.exists():
        raise SarlError(f"bench learn: {work} exists; give a new --dir")
    taken = [str(p) for p in runs.values() if p.exists()]
    if taken:
        raise SarlError(f"bench learn: {', '.join(taken)} exist; give another --runs or remove them")
    work.mkdir(parents=True)
    return Steps(work)


def check_temperatures(args: Any) -> None:
    """Before anything is made: temperatures that can sample, and none given
    to RL another way (the band is measured at the one RL samples at)."""
    from pydantic import TypeAdapter, ValidationError

    from rl.engine.config import Temperature

    for t in args.temperatures:
        try:
            TypeAdapter(Temperature).validate_python(t)
        except ValidationError as e:
            raise SarlError(f"bench learn: --temperatures {t}: {e.errors()[0]['msg']}") from None
        if t == 0:
            raise SarlError("bench learn: --temperatures 0: greedy samples of a task all agree, so no group has signal")
    if any(o.split("=", 1)[0].strip() == "rollout.agent.temperature" for o in args.rl_set):
        raise SarlError("bench learn: give RL's temperature by --temperatures (the band is measured at it), "
                        "not --rl-set rollout.agent.temperature")  # fmt: skip


def chosen_temperature(measured: dict[str, dict[str, Any]]) -> float:
    """RL's temperature, of those measured (by str(T)): the one where the
    most candidates have signal, then the lower crash share."""
    return float(max(measured, key=lambda t: (measured[t]["with_signal"], -(measured[t]["crash_share"] or 0.0))))


def count_tasks(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def leak_counts(sh: Steps, level: str, files: list[str]) -> dict[str, Any]:
    """`sarl tasks leaks FILES... --level LEVEL`: the counts (the report is in
    logs/); a leak stops the benchmark."""
    out = json.loads(sh(f"leaks-{level}-{Path(files[-1]).stem}", "tasks", "leaks", *files, "--level", level,
                        "--json", ok=(0, 1)))[level]  # fmt: skip
    if out["leaking_held_tasks"]:
        raise SarlError(f"bench learn: {out['leaking_held_tasks']} tasks of {files[-1]} leak ({level}) from "
                        f"{' + '.join(files[:-1])}: see {sh.work / 'logs'}")  # fmt: skip
    return {k: out[k] for k in ("train_tasks", "held_tasks", "leaking_held_tasks")}


QUICK_SFT = ["learner.steps=2", "learner.samples_per_step=4", "learner.micro_batches=1", "learner.publish_every=1"]
"""--quick: the warm start's overrides, in both chains."""


def drop_weights(runs: dict[str, Path]) -> None:
    """The runs' weights and checkpoints (GBs), once measured; not the role state."""
    for run in runs.values():
        shutil.rmtree(RunLayout(run).store_path, ignore_errors=True)
        for step in RunLayout(run).checkpoints("learner").glob("step-*"):
            shutil.rmtree(step, ignore_errors=True)

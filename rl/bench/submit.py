"""`sarl bench submit`: how long a user waits between asking for a 1,000-task
array and seeing it in squeue, through sarl and through the alternatives,
measured in the same run, in rotating order, median of the repetitions.

  sbatch        `sbatch --array=0-999` of a one-line script (a C client)
  python        a Python interpreter that runs that same sbatch (the floor for
                any Python submitter: interpreter start plus one sbatch)
  submitit      stock submitit `map_array` of 1,000 calls, from a fresh
                interpreter (one pickle and folder per task)
  sarl          `sarl submit` of a 1,000-task smoke role, from a fresh
                interpreter (config validation, run directory, one pickle)

Every array is submitted held (`--hold`) and cancelled at once: nothing runs.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w

SUBMITIT_SCRIPT = """
import sys, submitit
ex = submitit.SlurmExecutor(folder=sys.argv[1] + "/%%j")
ex.update_parameters(time=10, additional_parameters={"hold": True}, array_parallelism=int(sys.argv[2])%s)
jobs = ex.map_array(abs, range(int(sys.argv[2])))
print(jobs[0].job_id.split("_")[0])
"""


def _run(cmd: list[str], cwd: Path) -> str:
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])}... failed: {out.stderr.strip()}")
    return out.stdout


def _until_in_squeue(job: str) -> None:
    deadline = time.time() + 60
    while time.time() < deadline:
        if subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], capture_output=True, text=True).stdout.strip():
            return
        time.sleep(0.005)
    raise RuntimeError(f"job {job} never appeared in squeue")


def bench_submit(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The figures, and the lines that show them beside their baselines."""
    from rl.run.executors import SubmitError

    if not shutil.which("sbatch") or subprocess.run(["sinfo", "-h"], capture_output=True).returncode != 0:
        raise SubmitError("needs a Slurm that answers (scripts/slurm-up.sh starts a local one)")
    from tqdm import tqdm

    n = args.tasks
    reps = 3 if args.quick else 9
    work = Path(tempfile.mkdtemp(prefix="sarl-bench-submit-"))
    try:
        methods = _methods(work, n, args.partition)
        times: dict[str, list[float]] = {k: [] for k in methods}
        order = list(methods)
        for i in tqdm(range(reps), desc=f"submit {n}-task arrays", unit="round", file=sys.stderr):
            for name in order[i % len(order) :] + order[: i % len(order)]:
                t0 = time.perf_counter()
                job = methods[name](i)
                _until_in_squeue(job)
                times[name].append(time.perf_counter() - t0)
                subprocess.run(["scancel", job], check=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "tasks": n,
        "repetitions": reps,
        "sarl_submit_s": round(med["sarl"], 4),
        "sbatch_submit_s": round(med["sbatch"], 4),
        "ratio": round(med["sarl"] / med["sbatch"], 2),
        "python_sbatch_s": round(med["python"], 4),
        "ratio_vs_python_sbatch": round(med["sarl"] / med["python"], 2),
        "stock_submitit_s": round(med["submitit"], 4),
        "speedup_vs_stock_submitit": round(med["submitit"] / med["sarl"], 2),
    }
    lines = [f"submit a {n}-task array and see it in squeue (median of {reps}):"]
    for k, label in (
        ("sbatch", "sbatch --array (baseline)"),
        ("python", "python -c + sbatch"),
        ("submitit", "stock submitit map_array"),
        ("sarl", "sarl submit"),
    ):
        lines.append(f"  {label:<28}{med[k]:8.3f} s   {med[k] / med['sbatch']:6.2f}x sbatch")
    lines.append(
        f"  ratio sarl / sbatch = {result['ratio']} (target <= 1.5); "
        f"sarl / python+sbatch = {result['ratio_vs_python_sbatch']}"
    )
    return result, lines


def _methods(work: Path, n: int, partition: str | None) -> dict[str, Callable[[int], str]]:
    """Four ways to submit the same held n-task array, each returning its job
    id: plain sbatch, sbatch from a Python process, stock submitit, and
    `sarl submit` of a smoke run."""
    script = work / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    sbatch = ["sbatch", "--parsable", "--hold", f"--array=0-{n - 1}", "-t", "10", "-o", "/dev/null"]
    if partition:
        sbatch += ["-p", partition]
    executor: dict[str, Any] = {"type": "slurm", "extra_sbatch": {"hold": True}}
    if partition:
        executor["partition"] = partition
    cfg = work / "bench.toml"
    cfg.write_text(tomli_w.dumps({
        "run": {"name": "bench", "root": str(work / "runs")},
        "executor": executor,
        "smoke": {"workers": n, "steps": 1, "step_s": 0, "job": {"time_min": 10}},
    }))  # fmt: skip
    submitit_py = work / "stock_submitit.py"
    submitit_py.write_text(SUBMITIT_SCRIPT % (f", partition={partition!r}" if partition else ""))

    def m_sbatch(i: int) -> str:
        return _run([*sbatch, str(script)], work).strip().split(";")[0]

    def m_python(i: int) -> str:
        code = (
            f"import subprocess; print(subprocess.run({[*sbatch, str(script)]!r}, capture_output=True, "
            "text=True, check=True).stdout)"
        )
        return _run([sys.executable, "-c", code], work).strip().split(";")[0]

    def m_submitit(i: int) -> str:
        return _run([sys.executable, str(submitit_py), str(work / f"submitit-{i}"), str(n)], work).strip()

    def m_sarl(i: int) -> str:
        out = _run([sys.executable, "-m", "jobs.cli", "submit", str(cfg), "--set", f"run.name=bench-{i}"], work)
        return out.split()[3]

    return {"sbatch": m_sbatch, "python": m_python, "submitit": m_submitit, "sarl": m_sarl}

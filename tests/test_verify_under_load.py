"""Verdicts do not depend on the machine's load: every shipped kind of
environment task, verified with its reference and its trivial answers on a
quiet machine, then again while two busy loops hold the cores, gets the
same verdicts. Once: three passes under load cost CI 3 minutes more (and
the other streams the cores the loops held); the busy-loop CI runs the whole
suite, this test among it, under such a load as well."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from rl.tasks.format import Task
from rl.verify.config import VerifyConfig
from rl.verify.verifier import Verifier

HARBOR = Path(__file__).parent / "fixtures" / "harbor"


def shipped_tasks() -> list[Task]:
    """Every hand-written workspace and Node.js task sarl ships, the SQL
    tasks of the hand-written databases and of one built from a domain, the
    Harbor fixtures, and function tasks of every generated family and of
    HumanEval."""
    from rl.tasks.harbor import import_harbor
    from rl.tasks.importers import import_humaneval
    from rl.tasks.node import node_tasks
    from rl.tasks.sql import sql_tasks
    from rl.tasks.synthesis import synthesize
    from rl.tasks.workspaces import workspace_tasks

    harbor = [import_harbor(HARBOR / n) for n in ("hello-file", "fix-csv-total", "word-count")]
    functions = synthesize("all", 40, seed=1) + import_humaneval()[:20]
    sql = [t for t in sql_tasks(1) if t.metadata["family"] in ("sql-shop", "sql-school", "sql-library", "sql-clinic")]
    return workspace_tasks() + sql + node_tasks() + harbor + functions


def verdicts(tasks: list[Task]) -> dict[tuple[str, int], tuple[object, ...]]:
    """(task, answer) -> what a verdict says, for the reference (answer 0)
    and each trivial answer; timings left out."""
    from rl.validation.report import answers

    out = {}
    with Verifier(VerifyConfig(parallel=2)) as v:
        for kind in sorted({t.test_format for t in tasks}):  # one verifier, a thread pool per kind
            jobs = []
            for t in (t for t in tasks if t.test_format == kind):
                ref, trivial = answers(t)
                jobs += [(t, i, a) for i, a in enumerate([ref, *(a for _, a in trivial)])]
            with ThreadPoolExecutor(2) as ex:
                got = list(ex.map(lambda j: v.verify(j[0], j[2][0], final_files=j[2][1]), jobs))
            for (t, i, _), g in zip(jobs, got, strict=True):
                out[(t.task_id, i)] = (g.passed, g.reward, g.checks["tests"], g.cases, g.cases_passed, g.failure)
    return out


@contextmanager
def busy_cores(n: int = 2) -> Iterator[None]:
    loops = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in loops:
            p.kill()
            p.wait()


@pytest.mark.slow
def test_every_shipped_environment_task_gets_the_same_verdicts_with_the_cores_busy() -> None:
    tasks = shipped_tasks()
    kinds = {t.test_format for t in tasks}
    assert {"workspace", "sql", "node", "harbor"} <= kinds and len(tasks) > 200
    quiet = verdicts(tasks)
    assert all(quiet[(t.task_id, 0)][0] for t in tasks)  # every reference passes
    assert not any(v[0] for (_, i), v in quiet.items() if i > 0)  # no trivial answer does
    with busy_cores():
        loaded = verdicts(tasks)
    differ = {k: (quiet[k], loaded[k]) for k in quiet if loaded[k] != quiet[k]}
    assert differ == {}

"""`sarl logs RUN [ROLE[/TASK]]`: a task's stdout and stderr, every attempt.

submitit writes each job's streams to `logs/ROLE/JOBID_RANK_log.{out,err}`.
A task that the watchers resubmitted ran under a new job id (a new pair of
files, found through the run's submission records); a task that Slurm
requeued ran again under the same id and appended to the same files. Each
start of a task writes one line (`rl.run.role.START_MARK`) to both streams,
so the files are cut into attempts by it, and each part is printed under
the attempt it comes from: `#2 (job 12_3 on node7, from step 40)`.

Progress bars redraw one line with carriage returns; only the last drawing
of each such line is printed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from submitit.core.utils import JobPaths

from rl.errors import ConfigError
from rl.run.role import START_MARK
from rl.run.rundir import RunDir

STREAMS = ("stderr", "stdout")
SUBMITIT_START = "- Starting with JobEnvironment("
"""submitit's first line of each start of a job, in its stdout."""


@dataclass(frozen=True)
class Part:
    """One attempt's lines of one stream of one task."""

    task: str
    """`learner/0`."""
    attempt: str
    """`#2 (job 12_3 on node7, from step 40)`, or `job 12_3` for lines that no start line names."""
    stream: str
    path: Path
    lines: list[str]


@dataclass(frozen=True)
class TaskFiles:
    task: str
    job_id: str
    paths: dict[str, Path]
    """stream -> file."""


def select(rd: RunDir, which: str | None) -> list[tuple[str, int]]:
    """The tasks `which` names: None (all), `ROLE` or `ROLE/TASK`; a
    ConfigError naming what exists otherwise."""
    roles = {name: rc.workers for name, rc in rd.config().roles().items()}
    if which is None:
        return [(role, t) for role, n in roles.items() for t in range(n)]
    role, _, task = which.partition("/")
    if role not in roles:
        raise ConfigError(f"{which}: the run has no role {role!r}; its roles: {', '.join(roles)}")
    if not task:
        return [(role, t) for t in range(roles[role])]
    if not task.isdigit() or int(task) >= roles[role]:
        raise ConfigError(f"{which}: {role} has tasks 0 to {roles[role] - 1}")
    return [(role, int(task))]


def task_files(rd: RunDir, role: str, task: int, rank: int = 0) -> list[TaskFiles]:
    """The files of every job the task ran under, oldest first."""
    out = []
    for record in rd.submissions(role):
        if task not in record["tasks"]:
            continue
        job_id = record["job_ids"][record["tasks"].index(task)]
        paths = JobPaths(rd.logs(role), job_id, rank)
        out.append(TaskFiles(f"{role}/{task}", job_id, {"stdout": paths.stdout, "stderr": paths.stderr}))
    return out


def clean(line: str) -> str:
    """The last drawing of a line redrawn with carriage returns."""
    pieces = [p for p in line.rstrip("\n").split("\r") if p.strip()]
    return pieces[-1] if pieces else ""


def _label(line: str) -> str:
    """`#2 (job 12_3 on node7, from step 40)` of a start line."""
    return line[len(START_MARK) :].partition(" ")[2]


def _whole_lines(path: Path, offsets: dict[Path, int]) -> list[str]:
    """The whole lines written to `path` since `offsets[path]` (a line still
    being written waits for its end), and the offset moved past them."""
    try:
        with open(path, "rb") as f:
            f.seek(offsets.get(path, 0))
            data = f.read()
    except FileNotFoundError:
        return []
    end = data.rfind(b"\n") + 1
    offsets[path] = offsets.get(path, 0) + end
    return data[:end].decode(errors="replace").splitlines()


def parts_of(files: TaskFiles, stream: str, offsets: dict[Path, int]) -> list[Part]:
    """A file cut into attempts at its start lines. submitit's own lines
    before a start line go with that start; lines of a start that wrote
    no start line (it failed before) are a part of their own."""
    path = files.paths[stream]
    cut: list[tuple[str, list[str]]] = []
    pending: list[str] = []
    for raw in _whole_lines(path, offsets):
        line = clean(raw)
        if line.startswith(START_MARK):
            cut.append((_label(line), [*pending, line]))
            pending = []
        elif pending or not cut or SUBMITIT_START in line:
            pending.append(line)
        else:
            cut[-1][1].append(line)
    if pending:
        cut.append(("", pending))
    return [Part(files.task, label or f"job {files.job_id}", stream, path, lines) for label, lines in cut]


def parts(rd: RunDir, role: str, task: int, streams: tuple[str, ...] = STREAMS, rank: int = 0,
          offsets: dict[Path, int] | None = None) -> list[Part]:  # fmt: skip
    """Every attempt's parts of the task, in the order they ran (`offsets`:
    where each file was read to)."""
    offsets = {} if offsets is None else offsets
    out = []
    for files in task_files(rd, role, task, rank):
        per_stream = {s: parts_of(files, s, offsets) for s in streams}
        for k in range(max((len(v) for v in per_stream.values()), default=0)):
            out += [v[k] for s, v in per_stream.items() if k < len(v)]
    return out


def header(part: Part) -> str:
    return f"==> {part.task} {part.attempt} {part.stream}: {part.path} <=="


def show(rd: RunDir, which: str | None, out: IO[str], lines: int = 0, streams: tuple[str, ...] = STREAMS,
         rank: int = 0, offsets: dict[Path, int] | None = None) -> int:  # fmt: skip
    """Print the parts of the tasks `which` names (the last `lines` lines of
    each, 0: all); the number of parts printed. `offsets` is filled with
    where each file was read to, for `follow` to go on from."""
    n = 0
    for role, task in select(rd, which):
        for part in parts(rd, role, task, streams, rank, offsets):
            body = part.lines[-lines:] if lines else part.lines
            print(header(part), file=out)
            for line in body:
                print(line, file=out)
            print(file=out)
            n += 1
    return n


def follow(rd: RunDir, which: str | None, out: IO[str], offsets: dict[Path, int], streams: tuple[str, ...] = STREAMS,
           rank: int = 0, poll_s: float = 1.0) -> None:  # fmt: skip
    """Print what the tasks' newest jobs write, from `offsets` on (where
    `show` read to), naming each source as it changes (like `tail -f` of
    several files), until every task followed has ended: done, or failed
    and not live."""
    from rl.run.status import role_status

    chosen = select(rd, which)
    current: Path | None = None
    while True:
        live = False
        for role in {r for r, _ in chosen}:
            st = role_status(rd, role, rd.config().roles()[role].workers)
            live |= any(t.live for t in st.detail if (role, t.task) in chosen)
        for role, task in chosen:
            for files in task_files(rd, role, task, rank)[-1:]:
                for s in streams:
                    for label, text in _new_lines(files, s, offsets):
                        if files.paths[s] != current or label:
                            current = files.paths[s]
                            attempt = label or f"job {files.job_id}"
                            print(f"==> {files.task} {attempt} {s}: {current} <==", file=out)
                        print(text, file=out)
        out.flush()
        if not live:
            return
        time.sleep(poll_s)


def _new_lines(files: TaskFiles, stream: str, offsets: dict[Path, int]) -> Iterator[tuple[str, str]]:
    """Whole lines added to the file since the last look, each with the
    attempt it starts (its start line's label) or ""."""
    for raw in _whole_lines(files.paths[stream], offsets):
        line = clean(raw)
        yield (_label(line) if line.startswith(START_MARK) else ""), line

"""`sarl status --wait`: follow a run until every task is done or failed.

On a terminal, one progress bar redrawn in place. Through a pipe or into a
file (a batch job's log), plain lines with no carriage return: one on every
change of the tasks' states, and one at most every `every_s` seconds
between them. The progress counted is what the run is for: the learner's
steps (`step k/N`, with the learner's own seconds per step and the time
left), else, for a run of rollouts alone, episodes; else tasks.

Generators serve the other roles. Once those are all done or failed,
nothing more happens without the user: the generators end by themselves
after a learner that is done, and serve on for a failed one until `sarl
resume` (or `sarl cancel`). So they are not waited for, except in a run of
generators alone.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import IO, Any

from rl.run.overview import duration
from rl.run.rundir import RunDir
from rl.run.status import run_status

POLL_S = 1.0


@dataclass(frozen=True)
class Progress:
    unit: str
    """`step`, `episodes` or `tasks done`."""
    done: int
    total: int
    rate: str = ""
    """How fast, in words (`41 s/step`), when known."""
    eta_s: float | None = None


def waited_roles(st: dict[str, Any]) -> list[str]:
    return [name for name in st["roles"] if name != "generator"] or list(st["roles"])


def progress_of(st: dict[str, Any]) -> Progress:
    training = st.get("training", {})
    if "learner" in training:
        x = training["learner"]
        pace = x.get("seconds_per_step")
        return Progress("step", x["step"], x["steps"], f"{pace:.0f} s/step" if pace else "", x.get("eta_s"))
    if "rollouts" in training and training["rollouts"].get("episodes_total"):
        r = training["rollouts"]
        rate = r["episodes_per_s"]
        left = r["episodes_total"] - r["episodes_committed"]
        return Progress(
            "episodes",
            r["episodes_committed"],
            r["episodes_total"],
            f"{rate:.2f} episodes/s" if rate else "",
            left / rate if rate and left > 0 else None,
        )
    waited = waited_roles(st)
    return Progress(
        "tasks done",
        sum(st["roles"][n]["counts"]["done"] for n in waited),
        sum(st["roles"][n]["tasks"] for n in waited),
    )


def progress_text(p: Progress) -> str:
    head = f"step {p.done}/{p.total}" if p.unit == "step" else f"{p.unit} {p.done}/{p.total}"
    extra = [x for x in (p.rate, f"ETA {duration(p.eta_s)}" if p.eta_s else "") if x]
    return head + (f" ({', '.join(extra)})" if extra else "")


def tasks_text(st: dict[str, Any]) -> str:
    """`rollout 2 running, 1 done; learner 1 running`: the waited roles' tasks."""
    out = []
    for name in waited_roles(st):
        c = st["roles"][name]["counts"]
        states = [
            f"{c[k]} {word}"
            for k, word in (("running", "running"), ("pending", "pending"), ("done", "done"), ("failed", "failed"))
            if c[k]
        ]
        out.append(f"{name} {', '.join(states) or 'not submitted'}")
    return "; ".join(out)


def _finished(st: dict[str, Any]) -> tuple[bool, int]:
    waited = waited_roles(st)
    counts = [st["roles"][n]["counts"] for n in waited]
    done, failed = sum(c["done"] for c in counts), sum(c["failed"] for c in counts)
    return done + failed >= sum(st["roles"][n]["tasks"] for n in waited), failed


def wait(rd: RunDir, out: IO[str], every_s: float = 30.0, tty: bool | None = None) -> int:
    """Follow the run until its waited tasks are all done or failed; the
    number that failed."""
    tty = _terminal(out) if tty is None else tty
    st = run_status(rd, store=False, disk=False)
    bar = _Bar(progress_of(st), out) if tty else None
    last_line_at, last_tasks = 0.0, ""
    while True:
        ended, failed = _finished(st)
        p, tasks = progress_of(st), tasks_text(st)
        if bar is not None:
            bar.show(p, tasks)
        elif tasks != last_tasks or ended or time.monotonic() - last_line_at >= every_s:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            print(f"{stamp}  {progress_text(p)}; {tasks}", file=out, flush=True)
            last_line_at, last_tasks = time.monotonic(), tasks
        if ended:
            break
        time.sleep(POLL_S)
        st = run_status(rd, store=False, disk=False)
    if bar is not None:
        bar.close()
    return failed


def _terminal(out: IO[str]) -> bool:
    """A terminal with room for a bar (a pseudo-terminal without a size, as
    `script` makes, gets the lines: tqdm draws nothing in 0 rows)."""
    try:
        size = os.get_terminal_size(out.fileno())
        return out.isatty() and size.columns > 0 and size.lines > 0
    except (OSError, ValueError, AttributeError):
        return False


class _Bar:
    """One tqdm bar, redrawn in place, over the run's progress unit."""

    def __init__(self, p: Progress, out: IO[str]):
        from tqdm import tqdm

        self.bar = tqdm(total=p.total, unit=p.unit.split()[0], desc=p.unit, file=out, dynamic_ncols=True)

    def show(self, p: Progress, tasks: str) -> None:
        self.bar.total = p.total
        self.bar.n = p.done
        self.bar.set_postfix_str(tasks + (f"; {p.rate}" if p.rate else ""), refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()

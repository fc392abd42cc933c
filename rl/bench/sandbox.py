"""`sarl bench sandbox`: sandbox costs beside their unsandboxed baselines.

* cold start: a fresh sandbox running `python3 -c pass` (one-shot, with its
  cgroups, host tmpfs and limits) vs the same command run plainly;
* resident executor: a snippet run in a forked child of the sandbox's resident process,
  round trip included, vs a plain `fork` of this interpreter running the same
  snippet with its output piped back;
* throughput: small test scripts (a function and its asserts, as in a
  HumanEval check) on one sandbox per core, vs the same scripts run by plain
  forks on as many threads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

SNIPPET = "x = 1"
CHECK = """
def candidate(xs):
    return sorted(set(xs))

def check(f):
    assert f([3, 1, 2, 3]) == [1, 2, 3]
    assert f([]) == []
    assert f([5]) == [5]

check(candidate)
"""


def _plain_fork(code: str) -> bytes:
    """Fork this interpreter, run `code` in the child, pipe its output back."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 1)
        try:
            exec(compile(code, "<snippet>", "exec"), {"__name__": "__main__"})
            os._exit(0)
        except BaseException:
            os._exit(1)
    os.close(w)
    out = b""
    while chunk := os.read(r, 65536):
        out += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return out


def _times_ms(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _rate(workers: int, total: int, make: Callable[[], Callable[[], Any]]) -> float:
    """Jobs per second with `workers` threads, each with its own runner from `make`."""
    runners = [make() for _ in range(workers)]
    per = total // workers
    done = [0] * workers

    def loop(i: int) -> None:
        for _ in range(per):
            runners[i]()
            done[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(workers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def bench_sandbox(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The figures, and the lines that show them beside their baselines."""
    from tqdm import tqdm

    from sandboxes.bwrap import BwrapSandbox
    from sandboxes.config import SandboxConfig
    from sandboxes.oneshot import run_once

    starts, snippets, checks = (40, 300, 600) if args.quick else (150, 2000, 3000)
    cores = os.cpu_count() or 1
    cfg = SandboxConfig()
    bar = tqdm(total=6, desc="bench sandbox", file=sys.stderr)
    pass_cmd = ["/usr/bin/python3", "-c", "pass"]
    for _ in range(5):  # warm the page cache and the slot's cgroups up
        run_once(pass_cmd, cfg)
        subprocess.run(pass_cmd, check=True)
    plain, cold = [], []
    for _ in range(starts):  # interleaved, so that noise hits both alike
        plain += _times_ms(lambda: subprocess.run(pass_cmd, check=True), 1)
        cold += _times_ms(lambda: run_once(pass_cmd, cfg), 1)
    bar.update(2)

    fork_ms = _times_ms(lambda: _plain_fork(SNIPPET), snippets)
    bar.update()
    with BwrapSandbox(cfg) as sb:
        for _ in range(20):
            sb.run_snippet(SNIPPET)
        resident_ms = _times_ms(lambda: sb.run_snippet(SNIPPET), snippets)
        failed = [r for r in (sb.run_snippet(CHECK) for _ in range(3)) if not r.ok]
        if failed:
            raise RuntimeError(f"the check snippet fails in the sandbox: {failed[0]}")
    bar.update()

    rate = _sandboxed_rate(cfg, cores, checks)
    bar.update()
    plain_rate = _rate(cores, checks, lambda: lambda: _plain_fork(CHECK))
    bar.update()
    bar.close()

    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    result = {
        "plain_start_ms": round(statistics.median(plain), 2),
        "cold_start_ms": round(statistics.median(cold), 2),
        "cold_start_overhead_ms": round(statistics.median(cold) - statistics.median(plain), 2),
        "plain_fork_p50_ms": round(pct(fork_ms, 0.5), 3),
        "plain_fork_p99_ms": round(pct(fork_ms, 0.99), 3),
        "resident_exec_p50_ms": round(pct(resident_ms, 0.5), 3),
        "resident_exec_p99_ms": round(pct(resident_ms, 0.99), 3),
        "verifications_per_s": round(rate, 1),
        "plain_verifications_per_s": round(plain_rate, 1),
        "cores": cores,
        "samples": {"starts": starts, "snippets": snippets, "checks": checks},
    }
    return result, _sandbox_lines(result)


def _sandboxed_rate(cfg: Any, cores: int, checks: int) -> float:
    """Test scripts a second, one resident sandbox per thread."""
    from sandboxes.bwrap import BwrapSandbox

    boxes: list[BwrapSandbox] = []

    def sandboxed() -> Callable[[], Any]:
        sb = BwrapSandbox(cfg)
        boxes.append(sb)
        return lambda: sb.run_snippet(CHECK)

    try:
        return _rate(cores, checks, sandboxed)
    finally:
        for sb in boxes:
            sb.close()


def _sandbox_lines(r: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    lines.append(f"sandbox costs beside their baselines ({r['cores']} cores):")
    lines.append(
        f"  cold start (python3 -c pass)  sandbox {r['cold_start_ms']:.1f} ms   plain {r['plain_start_ms']:.1f} ms"
        f"   overhead {r['cold_start_overhead_ms']:.1f} ms (target <= 10)"
    )
    lines.append(
        f"  resident snippet  p50 {r['resident_exec_p50_ms']:.2f} ms  p99 {r['resident_exec_p99_ms']:.2f} ms   "
        f"plain fork p50 {r['plain_fork_p50_ms']:.2f} ms  p99 {r['plain_fork_p99_ms']:.2f} ms   (target p50 <= 3)"
    )
    lines.append(
        f"  test scripts      {r['verifications_per_s']:.0f}/s sandboxed   {r['plain_verifications_per_s']:.0f}/s "
        f"plain forks   (target >= 150)"
    )
    return lines

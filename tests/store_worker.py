"""Processes that the store tests start, kill and restart.

python store_worker.py writer STORE WRITER_ID BATCHES SAMPLES TOKENS
python store_worker.py learner RUN_DIR EVERY [MAX_BATCHES]
python store_worker.py poller STORE SECONDS
"""

from __future__ import annotations

import json
import sys
import time
import zlib

import numpy as np

from rl.learner.checkpoints import LearnerCheckpoints
from rl.store import CorruptData, Cursor, Sample, Store, StoreError


def make_samples(writer: str, seq: int, n: int, tokens: int) -> list[Sample]:
    """Deterministic content, so that a reader can check every value."""
    out = []
    for i in range(n):
        base = zlib.crc32(f"{writer}/{seq}".encode()) % 1000 + i
        length = tokens + (i % 3)
        out.append(
            Sample(
                task_id=f"{writer}/{seq}/{i}",
                group_id=seq * 1000 + i,
                policy_version=seq,
                tokens=(np.arange(length, dtype=np.int32) + base) % 50000,
                loss_mask=(np.arange(length) % 2).astype(np.uint8),
                logprobs=-np.full(length, 0.5, dtype=np.float32),
                reward=float(i % 2),
                checks={"tests": float(i % 2), "lint": 1.0},
                timings={"generate_s": 0.1, "execute_s": 0.2, "verify_s": 0.3},
                temperature=(0.0, 0.7, 1.0)[i % 3],
            )
        )
    return out


def writer(store: str, writer_id: str, batches: int, samples: int, tokens: int) -> None:
    w = Store(store).writer(writer_id)
    for seq in range(batches):
        print(f"writing {seq}", flush=True)
        w.write(seq, make_samples(writer_id, seq, samples, tokens))
    print("done", flush=True)


def learner(run_dir: str, every: int, max_batches: int) -> None:
    """Consumes batches into a 'model' (how often each batch was applied),
    checkpointing model and cursor together every `every` batches."""
    store = Store.of_run(run_dir)
    ckpts = LearnerCheckpoints(run_dir)
    last = ckpts.latest()
    cursor = last.cursor if last else Cursor()
    model: dict[str, int] = json.loads((last.path / "model.json").read_text()) if last else {}
    step = last.step if last else 0
    for consumed, key in enumerate(store.reader().unconsumed(cursor), start=1):
        batch = store.reader().read(key)
        assert len(batch) > 0
        name = f"{key[0]}/{key[1]}"
        model[name] = model.get(name, 0) + 1
        cursor.add(key)
        if consumed % every == 0:
            step += 1
            ckpts.save(
                step,
                cursor,
                {"batches": len(cursor)},
                write_payload=lambda p: (p / "model.json").write_text(json.dumps(model)),
            )
        print(f"consumed {name}", flush=True)
        if consumed >= max_batches:
            break
    step += 1
    ckpts.save(
        step, cursor, {"batches": len(cursor)}, write_payload=lambda p: (p / "model.json").write_text(json.dumps(model))
    )
    print("checkpointed", flush=True)


def poller(store: str, seconds: float) -> None:
    """Reads everything committed, again and again, and loads the newest
    weights between batches (not only once a sweep: sweeps grow long as
    batches accumulate); reports what it saw."""
    s = Store(store)
    counts = {"reads": 0, "loads": 0, "errors": 0}
    # the window opens at the first committed batch: on a busy machine the writers may still be
    # starting when the poller is (a fixed window could close before anything was written)
    give_up = time.time() + 120
    while not s.reader().committed() and time.time() < give_up:
        time.sleep(0.05)
    end = time.time() + seconds

    def enough() -> bool:  # a starved poller reads on past its window, until it has seen enough
        return (counts["reads"] > 10 and counts["loads"] > 10) or time.time() > end + 120

    def load_weights() -> None:
        if s.weights.latest() is None:
            return
        try:
            v, t = s.weights.load()
            if float(t["w"][0]) != float(v):
                counts["errors"] += 1
            counts["loads"] += 1
        except (CorruptData, StoreError, FileNotFoundError) as e:
            print(f"error weights: {e}", flush=True)
            counts["errors"] += 1

    while time.time() < end or not enough():
        for key in s.reader().committed():
            try:
                b = s.reader().read(key)
                expected = make_samples(key[0], key[1], len(b), len(b.sample(0).tokens))
                if [x.task_id for x in b.samples()] != [x.task_id for x in expected]:
                    counts["errors"] += 1
                counts["reads"] += 1
            except (CorruptData, StoreError, FileNotFoundError) as e:
                print(f"error {key}: {e}", flush=True)
                counts["errors"] += 1
            if counts["reads"] % 20 == 0:
                load_weights()
            if time.time() >= end and enough():
                break
        load_weights()
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "writer":
        writer(args[0], args[1], int(args[2]), int(args[3]), int(args[4]))
    elif cmd == "learner":
        learner(args[0], int(args[1]), int(args[2]) if len(args) > 2 else 10**9)
    elif cmd == "poller":
        poller(args[0], float(args[1]))
    else:
        raise SystemExit(f"unknown command {cmd}")

"""Rollout batches: written by rollout workers, consumed once by the learner.

Layout: `store.zarr/rollouts/<writer>/<seq:010d>/`, one committed group per
batch (see zgroup). Columns:

  tokens    int32  [T]      every sample's token ids, concatenated
  versions  int32  [T]      the weight version that sampled each token, -1
                            for prompt and observation tokens; the loss mask
                            is `versions >= 0` (a trajectory can span several
                            versions when weights change mid-episode)
  logprobs  float32[T]      behaviour log-prob of each token under the policy
                            version that sampled it; 0 where loss_mask is 0
  offsets   int64  [N+1]    sample i is tokens[offsets[i]:offsets[i+1]]
  ids       int64  [N, 2]   group_id (samples of one prompt share it),
                            policy_version (weight version that sampled it)
  scores    float64[N, K]   reward, then every check's score, then the
                            timings generate_s, execute_s, verify_s, then
                            the sampling temperature; column names in the
                            attribute `score_columns`
attributes: writer, seq, score_columns, task ids and failures (strings).
Per-sample values share two arrays, and the loss mask is the version column's
sign, so that a batch is 6 arrays: 14 files in
7 folders, which matters on a parallel filesystem's metadata server.

Exactly once: a batch is keyed by (writer, seq). A writer restarted after a
crash that writes the same seq again finds it committed and commits nothing.
The learner keeps a `Cursor` of consumed keys in its checkpoint; after a
restart `unconsumed(cursor)` yields every committed batch it has not
consumed, once, oldest commit first.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rl.fsio import sweep_temporaries
from rl.store.cursor import Cursor
from rl.store.zgroup import (
    MARKER,
    CorruptData,
    Damage,
    StoreError,
    read_attributes,
    read_group,
    read_marker,
    write_committed,
)

TIMINGS = ("generate_s", "execute_s", "verify_s")
_WRITER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class BadRollout(StoreError, ValueError):
    """A sample or batch that cannot be stored; the message says which field."""


@dataclass
class Sample:
    """One episode's trajectory as the learner sees it."""

    task_id: str
    """The task the episode attempted."""
    group_id: int
    """Samples of the same prompt share a group id (for group-relative advantages)."""
    policy_version: int
    """Weight version that sampled this trajectory's policy tokens."""
    tokens: np.ndarray
    """All token ids of the episode, prompt and observations included (int32)."""
    loss_mask: np.ndarray
    """1 where the policy produced the token (trained on), 0 elsewhere."""
    logprobs: np.ndarray
    """Behaviour log-prob of each token when sampled; 0 where loss_mask is 0."""
    reward: float
    """Aggregated reward of the episode."""
    checks: dict[str, float] = field(default_factory=dict)
    """Each verification check's score, by name: the same names in every
    sample of a batch, NaN where a check did not apply to the task (never
    infinite). `rl.verify.verdict.Verdict.sample_checks()` gives this form."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent: generate_s, execute_s, verify_s."""
    failure: str = ""
    """Why the episode failed (infrastructure or policy), empty if it did not."""
    versions: np.ndarray | None = None
    """Weight version that sampled each token, -1 where loss_mask is 0. None:
    `policy_version` for every sampled token."""
    episode_id: str = ""
    """The episode's identity in the run (`GROUP/INDEX` for rollouts): the
    same episode played again after a crash has the same identity."""
    temperature: float = 1.0
    """The temperature the policy's tokens were sampled at (0: greedy).
    `logprobs` are of the logits divided by it, and the learner computes
    its own at the same temperature: the importance ratio compares one
    distribution with itself. Each sample carries its own, so that batches
    sampled at different temperatures (an agent's, an endpoint client's)
    train side by side."""

    retokenized: int = 0
    """Calls of the episode whose rendered prompt did not extend the ids
    sampled before (an endpoint session's re-tokenisation drift,
    rl.gateway.capture): each began a sample of its own."""

    def token_versions(self) -> np.ndarray:
        if self.versions is not None:
            return np.asarray(self.versions)
        return np.where(np.asarray(self.loss_mask) == 1, self.policy_version, -1).astype(np.int32)


@dataclass
class BatchInfo:
    """A committed batch's per-sample labels, without its arrays."""

    key: tuple[str, int]
    task_ids: list[str]
    failures: list[str]
    episode_ids: list[str]


@dataclass
class RolloutBatch:
    """A committed batch, in columns (see the module docstring)."""

    key: tuple[str, int]
    columns: dict[str, np.ndarray]
    check_names: list[str]
    task_ids: list[str]
    failures: list[str]
    committed_at: float
    episode_ids: list[str] = field(default_factory=list)
    """Each sample's episode identity; empty in batches written without them."""
    retokenized: list[int] = field(default_factory=list)
    """Each sample's `retokenized`; empty in batches written without them."""

    def __len__(self) -> int:
        return len(self.task_ids)

    @property
    def reward(self) -> np.ndarray:
        return self.columns["scores"][:, 0]

    @property
    def checks(self) -> np.ndarray:
        """[N, C] scores, columns in `check_names` order."""
        return self.columns["scores"][:, 1 : 1 + len(self.check_names)]

    @property
    def timings(self) -> np.ndarray:
        """[N, 3]: generate_s, execute_s, verify_s."""
        c = 1 + len(self.check_names)
        return self.columns["scores"][:, c : c + len(TIMINGS)]

    @property
    def temperature(self) -> np.ndarray:
        """[N]: each sample's sampling temperature (1 in a batch written
        before samples carried theirs)."""
        scores, c = self.columns["scores"], 1 + len(self.check_names) + len(TIMINGS)
        return scores[:, c] if scores.shape[1] > c else np.ones(len(scores))

    @property
    def group_id(self) -> np.ndarray:
        return self.columns["ids"][:, 0]

    @property
    def policy_version(self) -> np.ndarray:
        return self.columns["ids"][:, 1]

    def sample(self, i: int) -> Sample:
        c = self.columns
        a, b = int(c["offsets"][i]), int(c["offsets"][i + 1])
        return Sample(
            task_id=self.task_ids[i],
            group_id=int(self.group_id[i]),
            policy_version=int(self.policy_version[i]),
            tokens=c["tokens"][a:b],
            loss_mask=(c["versions"][a:b] >= 0).astype(np.uint8),
            versions=c["versions"][a:b],
            logprobs=c["logprobs"][a:b],
            reward=float(self.reward[i]),
            checks=dict(zip(self.check_names, map(float, self.checks[i]), strict=True)),
            timings=dict(zip(TIMINGS, map(float, self.timings[i]), strict=True)),
            failure=self.failures[i],
            episode_id=self.episode_ids[i] if self.episode_ids else "",
            temperature=float(self.temperature[i]),
            retokenized=self.retokenized[i] if self.retokenized else 0,
        )

    def samples(self) -> list[Sample]:
        return [self.sample(i) for i in range(len(self))]


def _columns(samples: Sequence[Sample]) -> tuple[dict[str, np.ndarray], list[str]]:
    if not samples:
        raise BadRollout("a batch needs at least one sample")
    names = sorted(samples[0].checks)
    check_keys = set(names)
    for i, s in enumerate(samples):
        n = np.shape(s.tokens)
        if len(n) != 1 or np.shape(s.loss_mask) != n or np.shape(s.logprobs) != n:
            _explain_shapes(i, s)
        if s.versions is not None and np.shape(s.versions) != n:
            raise BadRollout(f"sample {i} ({s.task_id!r}): versions has shape {np.shape(s.versions)}, tokens {n}")
        if s.checks.keys() != check_keys:
            raise BadRollout(f"sample {i} ({s.task_id!r}): checks {sorted(s.checks)} differ from the batch's {names}")
        if not math.isfinite(s.reward):
            raise BadRollout(f"sample {i} ({s.task_id!r}): reward is {s.reward}")
        if not (isinstance(s.temperature, int | float) and math.isfinite(s.temperature) and s.temperature >= 0):
            raise BadRollout(
                f"sample {i} ({s.task_id!r}): temperature is {s.temperature!r}; "
                "the temperature its tokens were sampled at is 0 (greedy) or a finite positive number"
            )
        for name, score in s.checks.items():
            if not isinstance(score, int | float) or math.isinf(score):
                raise BadRollout(
                    f"sample {i} ({s.task_id!r}): checks[{name!r}] is {score!r}; "
                    "a score is a finite number, or NaN where the check does not apply"
                )
        if s.timings and not s.timings.keys() <= _TIMING_KEYS:
            raise BadRollout(
                f"sample {i} ({s.task_id!r}): unknown timings {sorted(set(s.timings) - _TIMING_KEYS)}; "
                f"known: {list(TIMINGS)}"
            )
    lengths = np.fromiter((len(s.tokens) for s in samples), dtype=np.int64, count=len(samples))
    offsets = np.zeros(len(samples) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.concatenate([s.tokens for s in samples])
    if tokens.size and (tokens.dtype.kind not in "iu" or tokens.min() < 0 or tokens.max() > np.iinfo(np.int32).max):
        raise BadRollout("tokens must be non-negative integers that fit int32")
    loss_mask = np.concatenate([s.loss_mask for s in samples]).astype(np.uint8, copy=False)
    if loss_mask.max(initial=0) > 1:
        raise BadRollout("loss_mask must hold only 0 and 1")
    versions = np.concatenate([s.token_versions() for s in samples]).astype(np.int32, copy=False)
    if versions.shape != loss_mask.shape or not np.array_equal(versions >= 0, loss_mask == 1):
        raise BadRollout("versions must be >= 0 exactly where loss_mask is 1 (the tokens the policy sampled)")
    scores = np.empty((len(samples), 1 + len(names) + len(TIMINGS) + 1), dtype=np.float64)
    scores[:, 0] = [s.reward for s in samples]
    for j, name in enumerate(names):
        scores[:, 1 + j] = [s.checks[name] for s in samples]
    for j, t in enumerate(TIMINGS):
        scores[:, 1 + len(names) + j] = [s.timings.get(t, 0.0) for s in samples]
    scores[:, -1] = [s.temperature for s in samples]
    cols: dict[str, np.ndarray] = {
        "tokens": tokens.astype(np.int32, copy=False),
        "versions": versions,
        "logprobs": np.concatenate([s.logprobs for s in samples]).astype(np.float32, copy=False),
        "offsets": offsets,
        "ids": np.array([(s.group_id, s.policy_version) for s in samples], dtype=np.int64),
        "scores": scores,
    }
    return cols, names


_TIMING_KEYS = set(TIMINGS)


def _explain_shapes(i: int, s: Sample) -> None:
    where = f"sample {i} ({s.task_id!r})"
    for name in ("tokens", "loss_mask", "logprobs"):
        if np.ndim(getattr(s, name)) != 1:
            raise BadRollout(f"{where}: {name} must be one-dimensional, got shape {np.shape(getattr(s, name))}")
    raise BadRollout(
        f"{where}: tokens, loss_mask and logprobs must have one length; "
        f"got {len(s.tokens)}, {len(s.loss_mask)}, {len(s.logprobs)}"
    )


class RolloutWriter:
    """Writes one worker's batches. One writer id per live worker."""

    def __init__(self, store: str | os.PathLike[str], writer: str):
        if not _WRITER.match(writer):
            raise BadRollout(f"writer id {writer!r}: letters, digits, '_', '.', '-' only")
        self.folder = Path(store) / "rollouts" / writer
        self.writer = writer
        self.folder.mkdir(parents=True, exist_ok=True)
        # what a previous incarnation of this writer left half-written
        sweep_temporaries(self.folder)

    def path(self, seq: int) -> Path:
        return self.folder / f"{seq:010d}"

    def committed_seqs(self) -> list[int]:
        return sorted(int(p.name) for p in self.folder.iterdir() if p.name.isdigit() and (p / MARKER).exists())

    def next_seq(self) -> int:
        seqs = self.committed_seqs()
        return seqs[-1] + 1 if seqs else 0

    def write(self, seq: int, samples: Sequence[Sample]) -> bool:
        """Commit batch `seq`. False when it was already committed (nothing written)."""
        if seq < 0:
            raise BadRollout(f"seq must be >= 0, got {seq}")
        cols, names = _columns(samples)
        attrs = {
            "writer": self.writer,
            "seq": seq,
            "check_names": names,
            "score_columns": [
                "reward",
                *(f"check/{n}" for n in names),
                *(f"time/{t}" for t in TIMINGS),
                "temperature",
            ],
            "task_ids": [s.task_id for s in samples],
            "failures": [s.failure for s in samples],
            "episode_ids": [s.episode_id for s in samples],
            "retokenized": [int(s.retokenized) for s in samples],
        }
        return write_committed(
            self.path(seq),
            cols,
            attrs=attrs,
            marker={"writer": self.writer, "seq": seq, "samples": len(samples), "tokens": int(cols["offsets"][-1])},
        )


class RolloutReader:
    """Lists and reads committed batches of every writer."""

    def __init__(self, store: str | os.PathLike[str]):
        self.folder = Path(store) / "rollouts"
        self.damaged: list[Damage] = []
        """What the last scan skipped, by path, with the reason."""

    def committed(self) -> list[tuple[str, int]]:
        """Every committed batch key, in a stable order: commit time, writer, seq.
        Damaged entries are left out and listed in `self.damaged`."""
        return self._scan(None)

    def unconsumed(self, cursor: Cursor) -> list[tuple[str, int]]:
        """Committed batches not in `cursor`, oldest commit first. Consumed
        batches are skipped by name, without reading their markers."""
        return self._scan(cursor)

    def _scan(self, skip: Cursor | None) -> list[tuple[str, int]]:
        """The committed batches; what looks like a batch but is not a sound
        one (no marker, a garbage marker, a marker naming another key, a file
        where a folder should be) is skipped and recorded in `self.damaged`."""
        self.damaged = []
        keys = []
        if not self.folder.is_dir():
            return []
        for wdir in sorted(self.folder.iterdir()):
            if wdir.name.startswith("."):
                continue
            if not wdir.is_dir():
                self.damaged.append(Damage(str(wdir), "a file where a writer's folder should be"))
                continue
            for b in sorted(wdir.iterdir()):
                if b.name.startswith("."):
                    continue  # a writer's temporary: swept when it restarts
                if not b.name.isdigit():
                    self.damaged.append(Damage(str(b), "not named like a batch"))
                    continue
                key = (wdir.name, int(b.name))
                if skip is not None and key in skip:
                    continue
                if not b.is_dir():
                    self.damaged.append(Damage(str(b), "a file where a batch folder should be"))
                    continue
                try:
                    m = read_marker(b)
                except StoreError as e:
                    self.damaged.append(Damage(str(b), str(e)))
                    continue
                if m is None:
                    self.damaged.append(Damage(str(b), "no commit marker: deleted, or never committed here"))
                    continue
                if (m.get("writer"), m.get("seq")) != key:
                    self.damaged.append(
                        Damage(str(b), f"its marker names batch {m.get('writer')}/{m.get('seq')}: a copy, not read")
                    )
                    continue
                keys.append((float(m.get("committed_at", 0.0)), wdir.name, int(b.name)))
        return [(w, s) for _, w, s in sorted(keys)]

    def info(self, key: tuple[str, int]) -> BatchInfo:
        """What a committed batch holds, from its attributes alone (one small
        file read): task ids, failures and episode identities."""
        writer, seq = key
        group = self.folder / writer / f"{seq:010d}"
        attrs = read_attributes(group)
        try:
            return BatchInfo(key, list(attrs["task_ids"]), list(attrs["failures"]), list(attrs.get("episode_ids", [])))
        except (KeyError, TypeError) as e:
            raise CorruptData(f"{group / 'zarr.json'}: attributes lack what a batch has ({e})") from None

    def read(self, key: tuple[str, int], verify: bool = True) -> RolloutBatch:
        writer, seq = key
        group = self.folder / writer / f"{seq:010d}"
        cols, marker = read_group(group, verify)
        attrs = read_attributes(group)
        try:
            return RolloutBatch(
                key=key,
                columns=cols,
                check_names=list(attrs["check_names"]),
                task_ids=list(attrs["task_ids"]),
                failures=list(attrs["failures"]),
                committed_at=float(marker["committed_at"]),
                episode_ids=list(attrs.get("episode_ids", [])),
                retokenized=[int(x) for x in attrs.get("retokenized", [])],
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptData(f"{group / 'zarr.json'}: attributes lack what a batch has ({e})") from None

"""Exact token capture: what every call of a session (an episode) fed the
engine and sampled, assembled into training samples.

An agent program re-sends its whole history as text at every call, and the
endpoint renders it again with the chat template. Re-tokenising text that
the policy sampled does not always give back the ids it sampled (a merge
that the tokenizer makes differently, a reply decoded and encoded again):
the known re-tokenisation drift. The learner must train on the ids that
were sampled, never on a re-tokenisation of them.

sarl trains turn by turn where the ids drift, and on whole episodes where
they do not. A call's sample holds its prompt as it was fed (loss_mask 0)
and its sampled ids with their log-probs and weight version (loss_mask 1).
A call whose fed prompt begins with the whole of an earlier sample (its
prompt, its sampled ids) extends that sample: the context between them is
added with loss_mask 0, so a session whose renderings agree is one sample,
as a native episode is. A call whose prompt does not extend any starts a
sample of its own; when its messages did continue the conversation (the
earlier messages and the reply the endpoint gave, unchanged), the ids
drifted: `mismatches` counts it. No sampled id is ever taken from a
rendering: every loss_mask-1 id is one the engine returned.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

from rl.agent.tokens import Trajectory


@dataclass
class CapturedCall:
    """One completion of one request of a session, as the engine saw it."""

    prompt_ids: list[int]
    """The prompt token ids the engine was fed."""
    sampled_ids: list[int]
    logprobs: list[float]
    """Behaviour log-prob of each sampled id (under `temperature`)."""
    version: int
    """The weight version that sampled them."""
    temperature: float
    finish_reason: str
    continues: bool = False
    """Its messages were an earlier call's, then the reply given to it: the
    conversation went on (a drift if its ids do not extend that call's)."""


@dataclass
class Assembled:
    """A session's calls as training samples."""

    samples: list[Trajectory]
    temperatures: list[float]
    mismatches: int
    """Calls whose conversation went on but whose rendered ids did not
    extend the sampled ones: each began a sample of its own."""
    calls: int


def assemble(calls: list[CapturedCall]) -> Assembled:
    """`calls` in order as samples (see the module's docstring)."""
    samples: list[Trajectory] = []
    temps: list[float] = []
    mismatches = 0
    for c in calls:
        into = next(
            (
                k
                for k in range(len(samples) - 1, -1, -1)
                if temps[k] == c.temperature and c.prompt_ids[: len(samples[k])] == samples[k].tokens
            ),
            None,
        )
        if into is None:
            mismatches += int(c.continues)
            samples.append(Trajectory.start(list(c.prompt_ids)))
            temps.append(c.temperature)
            into = len(samples) - 1
        else:
            samples[into].add_context(list(c.prompt_ids[len(samples[into]) :]))
        samples[into].add_sampled(list(c.sampled_ids), list(c.logprobs), c.version)
    return Assembled(samples, temps, mismatches, len(calls))


@dataclass
class Session:
    """An episode's calls to the endpoint, recorded as they are answered."""

    id: str
    key: str
    """The bearer token scoped to this session alone."""
    calls: list[CapturedCall] = field(default_factory=list)
    conversations: list[list[dict[str, Any]]] = field(default_factory=list)
    """Each answered choice's messages with its reply: what a call that goes
    on with the conversation sends again."""
    max_calls: int | None = None
    """Requests the session may make (None: no bound); more are refused."""
    asked: int = 0
    """Requests it has made, answered or not."""
    infra: list[str] = field(default_factory=list)
    """Why calls failed on the endpoint's side (no generator, an engine
    error): an episode with any is an infrastructure failure, never scored."""
    generate_s: float = 0.0
    """Seconds its calls spent being sampled (or waiting for a generator)."""
    waited_s: float = 0.0
    """Of which: seconds with no generator to send a call to."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ask(self) -> bool:
        """Count a request; False when it is one more than `max_calls`."""
        with self.lock:
            if self.max_calls is not None and self.asked >= self.max_calls:
                return False
            self.asked += 1
            return True

    def served(self, seconds: float, failure: str = "", waited_s: float = 0.0) -> None:
        with self.lock:
            self.generate_s += seconds
            self.waited_s += waited_s
            if failure:
                self.infra.append(failure)

    def continues(self, messages: list[dict[str, Any]]) -> bool:
        with self.lock:
            return any(len(messages) > len(c) and messages[: len(c)] == c for c in self.conversations)

    def record(self, call: CapturedCall, conversation: list[dict[str, Any]] | None) -> None:
        with self.lock:
            self.calls.append(call)
            if conversation is not None:
                self.conversations.append(conversation)

    def assembled(self) -> Assembled:
        with self.lock:
            return assemble(list(self.calls))


class Sessions:
    """The open sessions of an endpoint, each with its own key."""

    def __init__(self, max_sessions: int = 4096):
        self.max_sessions = max_sessions
        self._open: dict[str, Session] = {}
        self._by_key: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, session_id: str, max_calls: int | None = None) -> Session:
        """A new session (an episode), or the one open under `session_id`."""
        with self._lock:
            s = self._open.get(session_id)
            if s is None:
                if len(self._open) >= self.max_sessions:
                    raise RuntimeError(f"{self.max_sessions} sessions open already: close finished episodes'")
                s = Session(session_id, "sk-sarl-" + secrets.token_urlsafe(24), max_calls=max_calls)
                self._open[session_id] = s
                self._by_key[s.key] = s
            return s

    def close(self, session_id: str) -> Session | None:
        """The session, no longer open: later calls under it are refused."""
        with self._lock:
            s = self._open.pop(session_id, None)
            if s is not None:
                self._by_key.pop(s.key, None)
            return s

    def get(self, session_id: str) -> Session | None:
        with self._lock:
            return self._open.get(session_id)

    def by_key(self, key: str) -> Session | None:
        with self._lock:
            return self._by_key.get(key)

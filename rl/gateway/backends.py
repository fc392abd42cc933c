"""What the endpoint samples with: the run's generators through their
client (harness episodes), or a generator service in this process
(`sarl serve`, benchmarks). Both take token ids and sampling parameters
and answer with the weight version and the completions, under the limits
of the native generator; a refusal is an ApiError."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

from rl.engine import BadRequest, Completion, check_prompts
from rl.engine.config import SamplingParams
from rl.gateway.api import ApiError


@dataclass
class Sampled:
    """A backend's answer to one request."""

    version: int
    """The weight version that sampled the completions."""
    outputs: list[list[Completion]]
    """`params.n` completions per prompt."""
    waited_s: float = 0.0
    """Seconds the request waited with no generator to send it to (not the
    policy's time: a harness episode cut by its deadline after such a wait is
    an infrastructure failure, rl.rollout.harness)."""


class Backend(Protocol):
    max_model_len: int
    vocab_size: int

    def version(self) -> int:
        """The live weight version (-1: none known)."""
        ...

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Sampled: ...


class ServiceBackend:
    """A GeneratorServer in this process: requests go into its queue as its
    own HTTP handler puts them, after the same checks (prompts within the
    vocabulary and `max_model_len`, prompts x n within `max_batch`, a full
    queue answered 503)."""

    def __init__(self, server: Any):
        self.server = server
        self.max_model_len = int(server.engine.max_model_len)
        self.vocab_size = int(server.engine.vocab_size)

    def version(self) -> int:
        return int(self.server.engine.version)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Sampled:
        try:
            check_prompts(prompts, params, self.vocab_size, self.max_model_len)
        except BadRequest as e:
            raise ApiError(400, str(e), param="prompt") from None
        if len(prompts) * params.n > self.server.max_batch:
            raise ApiError(
                400, f"{len(prompts)} prompt(s) x n {params.n} exceeds max_batch {self.server.max_batch}", param="n"
            )
        pending = self.server.submit(prompts, params)
        if pending is None:
            raise ApiError(503, f"busy: {self.server.max_queue} requests queued", "server_error")
        if not pending.done.wait(self.server.request_timeout_s):
            raise ApiError(504, f"not served within {self.server.request_timeout_s} s", "server_error")
        if pending.error is not None:
            raise ApiError(500, pending.error, "server_error")
        return Sampled(int(pending.version), pending.outputs)


class ClientBackend:
    """The run's generator array, through GeneratorClient (balancing,
    failover, back-pressure). The generators check every request again."""

    def __init__(self, client: Any, max_model_len: int, vocab_size: int):
        self.client = client
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self._version = (-1, 0.0)

    def version(self) -> int:
        v, at = self._version
        if time.monotonic() - at > 1.0:  # the announcements, read at most once a second
            v = max((e.version for e in self.client.endpoints()), default=-1)
            self._version = (v, time.monotonic())
        return v

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Sampled:
        from rl.serving.client import NoGenerator

        try:
            r = self.client.generate(prompts, params)
        except BadRequest as e:
            raise ApiError(400, str(e)) from None
        except NoGenerator as e:
            raise ApiError(503, f"no generator could serve: {e}", "server_error") from None
        self._version = (r.version, time.monotonic())
        return Sampled(r.version, r.outputs, r.waited_s)

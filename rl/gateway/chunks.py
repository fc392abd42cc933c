"""A chat completion as OpenAI's streaming format sends it: one chunk for
the role, one per piece of content (with its log-prob), one for the tool
calls, one for the finish."""

from __future__ import annotations

from typing import Any


def token_logprob(piece: str, x: float) -> dict[str, Any]:
    """A sampled token's entry of a chat choice's `logprobs.content`."""
    return {"token": piece, "logprob": x, "bytes": list(piece.encode()), "top_logprobs": []}


def chat_chunks(
    j: int,
    content: str,
    start: str,
    parts: list[str],
    calls: list[dict[str, Any]],
    lp: dict[str, Any] | None,
    finish: str,
) -> list[dict[str, Any]]:
    """Choice `j` as a stream's chunks: its role, its content piece by piece
    (`start`, the forced opening, first and without log-probs), its calls,
    and its finish."""

    def chunk(delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> dict[str, Any]:
        return {"choices": [{"index": j, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    said = 0
    if start and content.startswith(start):
        out.append(chunk({"content": start}))
        said = len(start)
    for k, p in enumerate(parts):
        p = p[: max(0, len(content) - said)]
        if not p:
            continue
        said += len(p)
        piece_lp = {"content": lp["content"][k : k + 1], "refusal": None} if lp else None
        out.append(chunk({"content": p}, piece_lp))
    if calls:
        deltas = [{"index": i, **c} for i, c in enumerate(calls)]
        out.append(chunk({"tool_calls": deltas}))
    out.append(chunk({}, None, finish))
    return out

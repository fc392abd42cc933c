"""OpenAI messages to prompt ids, and sampled ids back to an OpenAI reply.

The prompt is rendered by `rl.model.chat_ids`, the one chat-template
rendering rollouts use, with tools offered as rollouts offer them
(`rl.agent.tools.with_tools`): to a template that renders tools, or in the
system message in the Hermes `<tool_call>` format. A reply's calls are
read in that same format.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from rl.agent.tools import call_text, split_calls, template_has_tools, with_tools
from rl.gateway.api import ApiError, ChatRequest, NamedTool


def conversation(req: ChatRequest) -> list[dict[str, Any]]:
    """The request's messages in one plain form (`developer` as `system`,
    content parts joined, each call as name and parsed arguments): what is
    rendered, and what tells a conversation that goes on from one that
    does not (rl.gateway.capture)."""
    out = []
    for m in req.messages:
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.role == "assistant" and m.tool_calls:
            d["tool_calls"] = [{"name": c.function.name, "arguments": c.function.parsed()} for c in m.tool_calls]
        out.append(d)
    return out


def reply_message(content: str, calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """A reply in the plain form of `conversation`."""
    d: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        d["tool_calls"] = [{"name": n, "arguments": a} for n, a in calls]
    return d


def template_messages(
    conv: list[dict[str, Any]], tools: list[dict[str, Any]] | None, tokenizer: Any, raw: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages for the chat template, declarations for it). `raw`: the
    exact text sampled for replies this endpoint gave, by their plain form's
    JSON; such a reply sent back is rendered as it was sampled."""
    native = template_has_tools(tokenizer)
    out: list[dict[str, Any]] = []
    for d in conv:
        if d["role"] == "assistant" and raw and (text := raw.get(json.dumps(d, sort_keys=True))) is not None:
            out.append({"role": "assistant", "content": text})
        elif d["role"] == "assistant" and d.get("tool_calls"):
            if native:
                calls = [{"type": "function", "function": c} for c in d["tool_calls"]]
                out.append({"role": "assistant", "content": d["content"], "tool_calls": calls})
            else:
                text = "".join(call_text(c["name"], c["arguments"]) for c in d["tool_calls"])
                out.append({"role": "assistant", "content": (d["content"] + "\n" if d["content"] else "") + text})
        elif d["role"] == "tool":
            out.append({"role": "tool" if native and tools else "user", "content": d["content"]})
        else:
            out.append({"role": d["role"], "content": d["content"]})
    messages, schemas, _ = with_tools(out, tools or [], tokenizer)
    return messages, schemas


def pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    """The text each sampled id adds (special tokens add none); joined, they
    are the decoded reply. An id that ends inside a character adds nothing,
    and the id that completes it adds the character. Each id is decoded
    with the one before it as context (as vLLM's detokenizer does): linear
    in the reply's length, where decoding every prefix would be quadratic."""
    decode = lambda x: tokenizer.decode(x, skip_special_tokens=True)  # noqa: E731
    out, prefix, read = [], 0, 0
    for i in range(len(ids)):
        before, now = decode(ids[prefix:read]), decode(ids[prefix : i + 1])
        if now.endswith("\ufffd") or not now.startswith(before):
            out.append("")
            continue
        out.append(now[len(before) :])
        prefix, read = read, i + 1
    if "".join(out) == decode(ids):
        return out
    out, said = [], ""  # a tokenizer whose windows do not add up: every prefix, slower but exact
    for i in range(len(ids)):
        now = decode(ids[: i + 1])
        out.append("" if now.endswith("\ufffd") else now[len(said) :])
        said = said if now.endswith("\ufffd") else now
    return out


def trimmed(text: str, stops: list[str]) -> str:
    """`text` without the stop string the engine ended it on (the engines
    keep it; the API does not)."""
    for s in stops:
        if s and text.endswith(s):
            return text[: -len(s)]
    return text


def reply(text: str, with_calls: bool) -> tuple[str | None, list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]:
    """(content, tool_calls in the API's form, the calls) of a reply."""
    if not with_calls:
        return text, [], []
    content, calls = split_calls(text)
    api = [
        {"id": "call_" + secrets.token_hex(12), "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for n, a in calls
    ]
    return (content or None) if calls else content, api, calls


def forced_start(choice: str | NamedTool | None, tools: list[dict[str, Any]], tokenizer: Any) -> str:
    """The text a reply is made to begin with, so that `tool_choice` holds:
    `"required"` opens a call (of the tool, when only one is given), a named
    function opens a call of it. It is
    fed as the end of the prompt (never sampled: `loss_mask` 0, no
    log-probs) and the reply is read with it. A call still has to be well
    formed: there is no constrained decoding of the arguments."""
    if choice is None or choice in ("auto", "none"):
        return ""
    names = [t["function"]["name"] for t in tools]
    if not names:
        raise ApiError(400, "tool_choice: only allowed when tools are given", param="tool_choice")
    tag = "<tool_call>\n" if template_has_tools(tokenizer) else "<tool_call>"
    if choice == "required" and len(names) > 1:
        return tag
    name = names[0] if choice == "required" else choice.function.name  # type: ignore[union-attr]
    if name not in names:
        raise ApiError(400, f"tool_choice: no tool named {name!r} among the tools given", param="tool_choice")
    return tag + '{"name": ' + json.dumps(name) + ', "arguments": '

"""Tools: typed declarations, how the policy sees them, how its calls are read.

A call is the Hermes convention that Qwen, verl and most chat templates with
tools use: a JSON object between tags, in the reply,

    <tool_call>{"name": "write_file", "arguments": {"path": "a.py", "content": "..."}}</tool_call>

Where the model's chat template renders tools itself (it names `tools`), the
declarations go to the template (`chat_ids(..., tools=...)`) and results
come back as `tool` messages; otherwise `protocol_text()` describes them in
the system message, in this module's one format, and results come back as a
user message. Either way the episode loop appends the result ids after the
sampled ids without re-tokenising them (rl.agent.tokens).

Whatever the policy writes, a call becomes a result or an observation with a
reason from TOOL_FAILURES, never an exception.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

TOOL_FAILURES = (
    "no-call",  # the reply held no tool call
    "malformed-call",  # not a JSON object with a name and an arguments object
    "unknown-tool",  # a name the episode does not offer
    "bad-arguments",  # an argument missing, unknown, or of the wrong type
    "call-timeout",  # the call hit its time limit
    "output-cut",  # the result was longer than the observation budget
    "outside-workspace",  # a path outside the episode's work dir
    "tool-error",  # a valid call the tool answered with an error: a file not there, an edit whose old text is
    # not in the file once (or changes nothing), a SQL error; the agent is told why
)
"""Why a tool call did not go as the policy meant, each counted per reply."""

INVALID_CALLS = ("no-call", "malformed-call", "unknown-tool", "bad-arguments")
"""Failures that make a reply's call invalid (the others happen to valid calls)."""


def tool_validity(calls: int, invalid: int) -> float:
    """The share of tool calls that were valid (a reply with no call counts as
    one invalid call): the same figure for rollouts and `sarl eval`."""
    return round(max(0, calls - invalid) / calls, 4) if calls else 0.0


_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


@dataclass(frozen=True)
class Param:
    """One argument of a tool."""

    name: str
    type: Literal["string", "integer", "number", "boolean"]
    description: str
    required: bool = True


@dataclass(frozen=True)
class Tool:
    """A tool the policy may call, with typed arguments."""

    name: str
    description: str
    params: tuple[Param, ...] = ()

    def schema(self) -> dict[str, Any]:
        """The OpenAI / chat-template function declaration."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {p.name: {"type": p.type, "description": p.description} for p in self.params},
                    "required": [p.name for p in self.params if p.required],
                },
            },
        }


@dataclass
class Call:
    """One call read from a reply: valid (`failure` empty) or why not."""

    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    failure: str = ""
    """"" for a valid call, else a reason from TOOL_FAILURES."""
    detail: str = ""
    """What exactly was wrong, for the observation."""


def template_has_tools(tokenizer: Any) -> bool:
    """Whether the model's chat template renders tool declarations itself."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tools" in template


def protocol_text(tools: list[dict[str, Any]]) -> str:
    """The tools (function declarations, `Tool.schema()` or an OpenAI
    request's) and the call format, for a system message (templates without
    tools)."""
    lines = [
        "You can use these tools. To call one, write in your reply:",
        '<tool_call>{"name": "TOOL_NAME", "arguments": {"ARG": "VALUE"}}</tool_call>',
        "The arguments are a JSON object. The results come back in the next message.",
        "Tools:",
    ]
    for t in tools:
        f = t.get("function", {})
        props = f.get("parameters", {}).get("properties", {}) or {}
        required = set(f.get("parameters", {}).get("required", []) or [])
        args = ", ".join(
            f"{n}: {(p or {}).get('type', 'any')}{'' if n in required else ' (optional)'}" for n, p in props.items()
        )
        lines.append(f"- {f.get('name', '?')}({args}): {f.get('description', '')}")
    return "\n".join(lines)


def with_tools(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], tokenizer: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str]:
    """A conversation offering `tools` (function declarations), as the chat
    template takes it: (its messages, the declarations for `chat_ids`, the
    role of a tool's result). A template that renders tools gets them and
    `tool` results; otherwise the system message describes them in this
    module's format, and results come back as user messages."""
    if not tools:
        return messages, None, "user"
    if template_has_tools(tokenizer):
        return messages, tools, "tool"
    text = protocol_text(tools)
    out = list(messages)
    if out and out[0].get("role") == "system":
        out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{text}"}
    else:
        out.insert(0, {"role": "system", "content": text})
    return out, None, "user"


def call_text(name: str, arguments: Any) -> str:
    """A call as the policy writes it (where the template does not render calls)."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def split_calls(reply: str) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """A reply's text before its first call, and its well-formed calls (name,
    arguments), unchecked against any declaration: what an OpenAI client is
    handed. A reply with a malformed call is all text, as a model's reply
    that called nothing."""
    found = _CALL.findall(reply)
    calls = []
    for body in found:
        c = _check(body.strip(), None)
        if c.failure:
            return reply, []
        calls.append((c.name, c.arguments))
    return (reply.split("<tool_call>", 1)[0].strip() if calls else reply), calls


def parse_calls(reply: str, tools: list[Tool], max_calls: int) -> list[Call]:
    """The calls of a reply, at most `max_calls` (later ones are ignored), each
    checked against the declarations. No call: one Call with `no-call`."""
    found = _CALL.findall(reply)
    if not found:
        return [Call(failure="no-call", detail="your reply held no <tool_call>")]
    by_name = {t.name: t for t in tools}
    return [_check(body.strip(), by_name) for body in found[:max_calls]]


def _check(body: str, by_name: dict[str, Tool] | None) -> Call:
    """`body` read as a call; checked against `by_name` (None: its form alone)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:
        return Call(failure="malformed-call", detail=f"not valid JSON: {str(e)[:120]}")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return Call(failure="malformed-call", detail='a call is a JSON object with "name" and "arguments"')
    name, args = data["name"], data.get("arguments", {})
    if isinstance(args, str):  # some templates put the arguments as a JSON string
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return Call(name, failure="malformed-call", detail="arguments is a string that is not a JSON object")
    if not isinstance(args, dict):
        return Call(name, failure="malformed-call", detail="arguments must be a JSON object")
    if by_name is None:
        return Call(name, args)
    tool = by_name.get(name)
    if tool is None:
        return Call(name[:60], args, "unknown-tool", f"no tool named {name[:60]!r}; tools: {', '.join(by_name)}")
    params = {p.name: p for p in tool.params}
    unknown = sorted(set(args) - set(params))
    if unknown:
        return Call(name, args, "bad-arguments", f"{name} takes no argument {unknown[0][:40]!r}")
    for p in tool.params:
        if p.name not in args:
            if p.required:
                return Call(name, args, "bad-arguments", f"{name} needs the argument {p.name!r} ({p.type})")
            continue
        v = args[p.name]
        if not isinstance(v, _TYPES[p.type]) or (p.type != "boolean" and isinstance(v, bool)):
            return Call(name, args, "bad-arguments", f"{name}: {p.name} must be a {p.type}")
    return Call(name, args)


def cut(text: str, tokenizer: Any, budget: int) -> tuple[str, bool]:
    """`text` cut in the middle to about `budget` tokens, and whether it was cut."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= budget:
        return text, False
    keep = max(1, (budget - 8) // 2)
    return tokenizer.decode(ids[:keep]) + "\n... (cut) ...\n" + tokenizer.decode(ids[-keep:]), True

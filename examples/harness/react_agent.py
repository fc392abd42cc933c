"""A small ReAct agent written against the official `openai` package, with
a shell tool and a file-writing tool: the kind of program a user already
has. sarl trains it unchanged (docs/endpoint.md): in a harness episode it
runs in the episode's sandbox, in the work dir that holds the task's files,
and `OpenAI()` finds the endpoint and its episode's key in
OPENAI_BASE_URL and OPENAI_API_KEY. It works the same against
`sarl serve`, or any OpenAI-compatible server:

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=... OPENAI_MODEL=NAME \\
        SARL_TASK="Make tests/test_slug.py pass." python3 react_agent.py
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from openai import OpenAI

SYSTEM = (
    "You are a coding agent working in a project directory. Use the tools to look at the files, run the "
    "tests and change the code. When the task is done, reply without calling a tool."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a shell command in the project directory; see its output.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file of the project (its whole content).",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
]


def run_tool(name: str, arguments: str) -> str:
    try:
        args = json.loads(arguments)
    except ValueError:
        return "error: the arguments are not a JSON object"
    if name == "shell" and isinstance(args.get("command"), str):
        try:
            p = subprocess.run(args["command"], shell=True, capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            return "error: the command took more than 20 s"
        out = (p.stdout + p.stderr)[-2000:]
        return f"exit code {p.returncode}\n{out}"
    if name == "write_file" and isinstance(args.get("path"), str) and isinstance(args.get("content"), str):
        path = Path(args["path"])
        if path.is_absolute() or ".." in path.parts:
            return "error: a path inside the project"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(args["content"])
        return f"wrote {path} ({len(args['content'])} characters)"
    return f"error: no tool {name!r} with those arguments"


def main() -> None:
    client = OpenAI()
    model = os.environ.get("OPENAI_MODEL", "policy")
    seed = int(os.environ.get("SARL_SEED", "0"))
    messages: list = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": os.environ["SARL_TASK"]}]
    for turn in range(int(os.environ.get("SARL_MAX_TURNS", "4"))):
        reply = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,
            max_tokens=int(os.environ.get("SARL_MAX_TOKENS", "256")),
            temperature=float(os.environ.get("SARL_TEMPERATURE", "0.8")),
            seed=seed + turn,
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            result = run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


if __name__ == "__main__":
    main()

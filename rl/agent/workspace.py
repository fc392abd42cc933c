"""The `workspace` environment: a folder of files, worked on with tools.

The task's `files` (a small package, its visible tests, a README) are the
episode's work dir, `/sandbox`. Each reply calls tools (rl.agent.tools):

    shell(command)             /bin/sh -c in the work dir, cut at the per-call
                               limit (`agent.run_s`) and the episode's deadline
    read_file(path)            a file of the work dir
    write_file(path, content)  create or replace a file of the work dir
    edit_file(path, old, new)  replace the one place where `old` occurs in a
                               file with `new`: a change without writing out
                               the rest of the file again (its docstrings'
                               quotes, JSON-escaped, are where a small model's
                               whole-file writes broke). An edit whose new
                               text is its old one is refused, and a write of
                               what a file already holds says so: a warm start
                               "fixed" code that way, 104 edits in 75 greedy
                               episodes, each told that it had edited the file
    submit()                   end the episode: the work dir is the answer

The answer is the work dir's final state (text files only, no byte code),
graded by the task's hidden tests in a fresh sandbox with the task's own
`tests/` put back (rl.verify.verifier): nothing the policy wrote, a test
edited, a `conftest.py`, a `sitecustomize.py`, a planted result, can reach
the process that grades. Reads and writes run as a small snippet in the
sandbox, so that a path outside the work dir (a `..`, a symlink) is an
observation with its reason, not an error of the sandbox.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from rl.agent.env import Environment, Final, Start, Step
from rl.agent.tools import Call, Param, Tool, parse_calls
from rl.tasks.format import Task
from sandboxes.config import Limits

WORK = "/sandbox"
SNAPSHOT_FILE_BYTES = 256 << 10
"""Largest file kept in the final state; a bigger one is left out of it."""
SNAPSHOT_BYTES = 2 << 20
"""Most bytes of the final state; files past it are left out."""

TOOLS = [
    Tool(
        "shell",
        "Run a shell command in the workspace and see its output and exit code.",
        (Param("command", "string", "the command, run by /bin/sh -c"),),
    ),
    Tool("read_file", "Show a file of the workspace.", (Param("path", "string", "path relative to the workspace"),)),
    Tool(
        "write_file",
        "Create or replace a file of the workspace with the given content.",
        (
            Param("path", "string", "path relative to the workspace"),
            Param("content", "string", "the whole new content of the file"),
        ),
    ),
    Tool(
        "edit_file",
        "Replace the one place where `old` occurs in a file of the workspace with `new`.",
        (
            Param("path", "string", "path relative to the workspace"),
            Param("old", "string", "text the file holds exactly once, whole lines with their indentation"),
            Param("new", "string", "what replaces it"),
        ),
    ),
    Tool("submit", "Finish: the workspace as it is now is your answer."),
]

SYSTEM_PROMPT = (
    "You are a careful software engineer working in a small code repository. "
    "Use the tools to read files, run commands and tests, and edit files. "
    "Make the change the task asks for, check it, then call submit."
)

MARKER = "@@SARL-FILES@@"

# Runs in the sandbox (stdlib only): reads, writes and the final snapshot,
# each path resolved (symlinks followed) and refused outside the work dir.
FILE_OPS = r"""
import json, os, sys
P = globals()["PARAMS"]
W = "/sandbox"
def inside(path):
    full = os.path.realpath(os.path.join(W, path))
    return full if full == W or full.startswith(W + "/") else None
def run():
    op = P["op"]
    if op == "snapshot":
        files, total, left_out = {}, 0, []
        for root, dirs, names in os.walk(W, followlinks=False):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not os.path.islink(os.path.join(root, d)))
            for name in sorted(names):
                full = os.path.join(root, name)
                rel = os.path.relpath(full, W)
                if os.path.islink(full) or not os.path.isfile(full) or name.endswith((".pyc", ".pyo")):
                    left_out.append(rel)
                    continue
                size = os.path.getsize(full)
                if size > P["file_bytes"] or total + size > P["total_bytes"]:
                    left_out.append(rel)
                    continue
                try:
                    files[rel] = open(full, "rb").read().decode("utf-8")
                except (UnicodeDecodeError, OSError):
                    left_out.append(rel)
                    continue
                total += size
        return {"files": files, "left_out": left_out}
    full = inside(P["path"])
    if full is None:
        return {"failure": "outside-workspace"}
    if op == "read":
        if not os.path.isfile(full):
            return {"error": "no such file"}
        data = open(full, "rb").read(P["max_bytes"] + 1)
        return {"text": data[: P["max_bytes"]].decode("utf-8", "replace"), "cut": len(data) > P["max_bytes"]}
    if op == "edit":
        if not os.path.isfile(full):
            return {"error": "no such file"}
        text = open(full, encoding="utf-8", errors="replace").read()
        found = text.count(P["old"]) if P["old"] else 0
        if found != 1:
            return {"error": "the old text is not in the file" if not found else
                    "the old text is in the file %d times: give more of its lines, so that it is there once" % found}
        P["content"] = text.replace(P["old"], P["new"], 1)
        if P["content"] == text:
            return {"error": "the new text is the old text: the file is unchanged"}
    # An edit that got here changes the file; only a write may rewrite what it holds.
    same = (op == "write" and os.path.isfile(full) and not os.path.islink(full)
            and open(full, "rb").read() == P["content"].encode())
    os.makedirs(os.path.dirname(full), exist_ok=True)
    if os.path.islink(full):
        os.unlink(full)
    with open(full, "w") as f:
        f.write(P["content"])
    return {"written": len(P["content"]), "unchanged": same}
try:
    result = run()
except OSError as e:
    result = {"error": "%s: %s" % (type(e).__name__, e.strerror or e)}
sys.stdout.write("\n@@SARL-FILES@@" + json.dumps(result) + "\n")
"""


def _file_op(sandbox: Any, params: dict[str, Any], limits: Limits) -> dict[str, Any]:
    r = sandbox.run_snippet(FILE_OPS, limits=limits, globals={"PARAMS": params}, cache=True)
    out = r.stdout.decode(errors="replace").rstrip("\n")
    _, sep, last = out.rpartition("\n" + MARKER)
    if not sep:
        return {"error": f"the file operation did not finish ({r.limit or 'no result'})"}
    result: dict[str, Any] = json.loads(last)
    return result


def diff(before: dict[str, str], after: dict[str, str]) -> str:
    """A unified diff of the work dir's files, the answer as text."""
    out: list[str] = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a == b:
            continue
        out += difflib.unified_diff(
            (a or "").splitlines(keepends=True),
            (b or "").splitlines(keepends=True),
            "/dev/null" if a is None else f"a/{path}",
            "/dev/null" if b is None else f"b/{path}",
        )
    return "".join(line if line.endswith("\n") else line + "\n" for line in out)


def first_message(task: Task) -> str:
    listing = "\n".join(f"  {p}" for p in sorted(task.files))
    return f"{task.prompt.rstrip()}\n\nThe workspace holds:\n{listing}"


class WorkspaceEnv(Environment):
    """Files and tools; graded on the work dir's final state."""

    tools = TOOLS
    system_prompt = SYSTEM_PROMPT

    def reset(self, task: Task) -> Start:
        for path, content in task.files.items():
            self.ctx.sandbox.write_file(f"{WORK}/{path}", content)
        return Start(
            [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": first_message(task)}],
            list(self.tools),
        )

    def step(self, reply: str, last: bool) -> Step:
        # a last reply's calls run too: its writes are part of the answer
        cfg = self.ctx.agent
        calls = parse_calls(reply, self.tools, cfg.max_tool_calls)
        parts, failures = [], []
        for call in calls:
            if call.failure:
                failures.append(call.failure)
                parts.append(f"[{call.name or 'tool call'}] {call.failure}: {call.detail}")
                continue
            if call.name == "submit":
                return Step(done=True, end="submitted", failures=failures, calls=len(calls))
            text, failure = self.call(call, max(1, cfg.observation_tokens // len(calls)))
            if failure:
                failures.append(failure)
            parts.append(f"[{call.name}] {text}")
            if self.ctx.time_left() <= 0:
                return Step(done=True, end="deadline", failures=failures, calls=len(calls))
        if calls and calls[0].failure == "no-call":
            parts = [
                'Your reply held no tool call. Call a tool with <tool_call>{"name": ..., "arguments": {...}}'
                "</tool_call>, and call submit when you are done."
            ]
        return Step("\n\n".join(parts), done=last, end="max-turns" if last else "", failures=failures, calls=len(calls))

    def call(self, call: Call, budget: int) -> tuple[str, str]:
        """Run one valid call: (the result text, a failure reason or "")."""
        from rl.agent.tools import cut

        limit_s = max(0.05, min(self.ctx.agent.run_s, self.ctx.time_left()))
        limits = Limits(wall_s=limit_s, cpu_s=2 * limit_s, memory_mb=self.ctx.task.limits.memory_mb)
        tokenizer = self.ctx.tokenizer
        if call.name == "shell":
            r = self.ctx.sandbox.exec(["/bin/sh", "-c", call.arguments["command"]], limits=limits, cwd=WORK)
            out = (r.stdout + r.stderr).decode(errors="replace")
            text, was_cut = cut(out, tokenizer, budget)
            if r.limit == "wall_time":
                return f"stopped after {limit_s:g} s (the per-call limit)\n{text}", "call-timeout"
            status = f"limit hit: {r.limit}" if r.limit else f"exit code {r.exit_code}"
            return f"{status}\n{text}", "output-cut" if was_cut else ""
        path = call.arguments["path"]
        if call.name == "read_file":
            got = _file_op(self.ctx.sandbox, {"op": "read", "path": path, "max_bytes": 1 << 20}, limits)
            if "failure" in got:
                return f"{path}: outside the workspace", got["failure"]
            if "error" in got:
                return f"{path}: {got['error']}", "tool-error"
            text, was_cut = cut(got["text"], tokenizer, budget)
            return f"{path}:\n{text}", "output-cut" if was_cut or got["cut"] else ""
        edit = call.name == "edit_file"
        args = call.arguments
        params = (
            {"op": "edit", "old": args["old"], "new": args["new"]}
            if edit
            else {"op": "write", "content": args["content"]}
        )
        got = _file_op(self.ctx.sandbox, {**params, "path": path}, limits)
        if "failure" in got:
            return f"{path}: outside the workspace, not written", got["failure"]
        if "error" in got:
            return f"{path}: not written: {got['error']}", "tool-error"
        if edit:
            return f"edited {path}: it now has {got['written']} characters", ""
        if got.get("unchanged"):  # a small model rewrites a file as it was, and would read "wrote" as a change
            return f"wrote {got['written']} characters to {path}: the same as it held, unchanged", ""
        return f"wrote {got['written']} characters to {path}", ""

    def final(self) -> Final:
        params = {"op": "snapshot", "file_bytes": SNAPSHOT_FILE_BYTES, "total_bytes": SNAPSHOT_BYTES}
        got = _file_op(self.ctx.sandbox, params, Limits(wall_s=10.0, cpu_s=10.0))
        if "files" not in got:
            from sandboxes import SandboxError

            raise SandboxError(f"the work dir could not be read: {got.get('error')}")
        files: dict[str, str] = got["files"]
        return Final(diff(self.ctx.task.files, files), files)

    def verify(self, final: Final) -> object:
        return self.ctx.verifier.verify(self.ctx.task, final.completion, final_files=final.files)

"""The `sql` environment: answer a question about a SQLite database.

The task ships its database as a script (`files["data.sql"]`), built in the
episode's sandbox at reset. The policy explores with the `sql` tool (read
only: the runner refuses every change, cuts long queries, and shows at most
`ROWS` rows), then calls `answer` with the query whose result answers the
question. The answer is graded in a fresh sandbox, on a fresh build of the
database, against the reference query's rows (rl.verify.verifier, the
`sql` test format).
"""

from __future__ import annotations

import re
from typing import Any

from rl.agent.env import Environment, Final, Start, Step
from rl.agent.tools import Param, Tool, cut, parse_calls
from rl.tasks.format import Task
from rl.verify.formats import SQL_SCRIPT
from sandboxes.config import Limits

DB = "/sandbox/data.db"
ROWS = 20
"""Rows of a result the policy sees."""

TOOLS = [
    Tool("sql", "Run a read-only SQL query on the database and see its result.", (Param("query", "string", "SQL"),)),
    Tool(
        "answer",
        "Give the SQL query whose result answers the question; this ends your turn.",
        (Param("query", "string", "the final SQL query"),),
    ),
]

SYSTEM_PROMPT = (
    "You answer questions about a SQLite database. Explore it with the sql tool, "
    "then call answer with the one SQL query whose result answers the question."
)


def schema_of(script: str) -> str:
    """The CREATE statements of a database script: what the policy is shown."""
    return "\n".join(m.strip() for m in re.findall(r"CREATE TABLE[^;]*;", script, re.I))


def table(columns: list[str], rows: list[list[Any]], more: bool) -> str:
    lines = [" | ".join(columns)] + [" | ".join("NULL" if v is None else str(v) for v in r) for r in rows]
    tail = f"\n... (more than {len(rows)} rows)" if more else f"\n({len(rows)} row{'s' if len(rows) != 1 else ''})"
    return "\n".join(lines) + tail


class SQLEnv(Environment):
    """Questions over a database; graded on the answer query's rows."""

    tools = TOOLS
    query = ""

    def reset(self, task: Task) -> Start:
        script = task.files.get(SQL_SCRIPT, "")
        got = self.ctx.verifier.run_sql({"op": "build", "script": script, "db": DB}, self._limits(), self.ctx.sandbox)
        if not got.get("ok"):
            raise RuntimeError(f"the task's database does not build: {got.get('error') or got.get('limit')}")
        user = f"{task.prompt.rstrip()}\n\nThe database:\n{schema_of(script)}"
        return Start([{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}], list(TOOLS))

    def _limits(self) -> Limits:
        wall = max(0.05, min(self.ctx.agent.run_s, self.ctx.time_left()))
        return Limits(wall_s=wall, cpu_s=2 * wall, memory_mb=self.ctx.task.limits.memory_mb)

    def step(self, reply: str, last: bool) -> Step:
        calls = parse_calls(reply, self.tools, self.ctx.agent.max_tool_calls)
        parts, failures = [], []
        budget = max(1, self.ctx.agent.observation_tokens // len(calls))
        for call in calls:
            if call.failure:
                failures.append(call.failure)
                parts.append(f"[{call.name or 'tool call'}] {call.failure}: {call.detail}")
                continue
            if call.name == "answer":
                self.query = call.arguments["query"]
                return Step(done=True, end="submitted", failures=failures, calls=len(calls))
            params = {"op": "query", "db": DB, "query": call.arguments["query"], "max_rows": ROWS}
            got = self.ctx.verifier.run_sql(params, self._limits(), self.ctx.sandbox)
            if got.get("limit") or got.get("cut"):
                failures.append("call-timeout")
                parts.append("[sql] stopped: the query ran past its time limit")
            elif "error" in got:
                failures.append("tool-error")
                parts.append(f"[sql] error: {got['error']}")
            else:
                text, was_cut = cut(table(got["columns"], got["rows"], got["more"]), self.ctx.tokenizer, budget)
                if was_cut:
                    failures.append("output-cut")
                parts.append(f"[sql]\n{text}")
        if calls[0].failure == "no-call":
            parts = [
                "Your reply held no tool call. Call sql to explore, or answer with your final query, as "
                '<tool_call>{"name": ..., "arguments": {"query": ...}}</tool_call>.'
            ]
        return Step("\n\n".join(parts), done=last, end="max-turns" if last else "", failures=failures, calls=len(calls))

    def final(self) -> Final:
        return Final(self.query)

    def verify(self, final: Final) -> object:
        return self.ctx.verifier.verify(self.ctx.task, final.completion)

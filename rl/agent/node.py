"""The `node` environment: write one JavaScript function, see it run on the
task's visible examples with Node.js, revise.

The protocol of the `function` environment in another runtime: each reply's
action is its last ```javascript block (or ```js, or any block, or bare code
from its first `function`); the code runs in the episode's sandbox on the
visible calls (rl/verify/node_runner.py), and the observation says which
failed and what the code printed. The last code is graded by the hidden
calls in a fresh sandbox. The task's `runtime` is `node`: the sandbox must
have Node.js, which `sarl tasks validate` checks.
"""

from __future__ import annotations

import json
import re

from rl.agent.env import Environment, Final, Start, Step
from rl.tasks.format import Task
from rl.verify.formats import node_spec

SYSTEM_PROMPT = (
    "You are a careful JavaScript programmer. Solve the task by writing the whole function "
    "in one ```javascript code block.\n"
    "After each reply, your code is run with Node.js on the examples from the task, and you see "
    "which examples failed. If one fails, reply with a corrected ```javascript block."
)

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)


def parse_js(reply: str) -> str:
    """The code of a reply: the last javascript/js block, else the last block,
    else the reply from its first line that starts a function."""
    blocks = _FENCE.findall(reply)
    tagged = [body for tag, body in blocks if tag.lower() in ("javascript", "js", "node", "mjs")]
    if tagged or blocks:
        return (tagged or [b for _, b in blocks])[-1].strip("\n")
    lines = reply.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(("function ", "const ", "let "))), None)
    return "" if start is None else "\n".join(lines[start:]).strip("\n")


class NodeEnv(Environment):
    """One JavaScript function, written in a ```javascript block per reply."""

    code = ""

    def reset(self, task: Task) -> Start:
        user = "Complete the following JavaScript function.\n```javascript\n" + task.prompt.rstrip() + "\n```"
        return Start([{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}])

    def step(self, reply: str, last: bool) -> Step:
        code = parse_js(reply)
        if code:
            self.code = code
        if last:
            return Step(done=True, end="max-turns")
        if not code:
            return Step("I found no ```javascript code block in your reply. Reply with the whole function in one.")
        spec = node_spec(self.ctx.task)
        k = spec["visible"]
        wall = max(0.5, min(self.ctx.agent.run_s, self.ctx.time_left()))
        run = self.ctx.verifier.run_node(
            self.ctx.task, code, spec["calls"][:k], spec["expected"][:k], self.ctx.sandbox, wall
        )
        cases = run.get("cases", [])
        if cases and all(c["ok"] for c in cases) and self.ctx.agent.stop_when_examples_pass:
            return Step(done=True, end="examples-pass", outcome=run)
        parts = []
        if run.get("limit"):
            parts.append(f"Your code was stopped: it hit the {run['limit'].replace('_', ' ')} limit.")
        if run.get("load_error"):
            parts.append("Your code did not load:\n" + str(run["load_error"]))
        if str(run.get("printed", "")).strip():
            parts.append("Output:\n" + str(run["printed"]).strip()[-1000:])
        if cases and not run.get("load_error"):
            failed = [(i, c) for i, c in enumerate(cases) if not c["ok"]]
            parts.append(f"Examples: {len(cases) - len(failed)} of {len(cases)} passed.")
            for i, c in failed[:5]:
                args = ", ".join(json.dumps(a) for a in spec["calls"][i])
                got = c.get("got", c["why"])
                parts.append(
                    f"  {self.ctx.task.entry_point}({args}): expected {json.dumps(spec['expected'][i])}, got {got}"
                )
        from rl.agent.tools import cut

        text = cut("\n".join(parts), self.ctx.tokenizer, self.ctx.agent.observation_tokens)[0]
        return Step(text, outcome=run)

    def final(self) -> Final:
        return Final(self.code)

    def verify(self, final: Final) -> object:
        return self.ctx.verifier.verify(self.ctx.task, final.completion)

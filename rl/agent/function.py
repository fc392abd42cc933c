"""The `function` environment: write one Python function, see it run on the
task's visible examples, revise.

Each reply's action is its last ```python block (rl.agent.actions); the code
runs after the prompt, with the visible examples, in the episode's sandbox
(rl.agent.observe), and the observation says what it printed and which
examples failed. The final answer is the last code the policy wrote, graded
by the task's hidden tests in a fresh sandbox. No tools: the reply is the
action, the protocol the quickstart's warm start teaches.
"""

from __future__ import annotations

from rl.agent.actions import as_completion, parse_action
from rl.agent.env import Environment, Final, Start, Step
from rl.agent.observe import Outcome, describe, run_action
from rl.agent.prompts import first_messages
from rl.tasks.format import Task


class FunctionEnv(Environment):
    """One Python function, written in a ```python block per reply."""

    code = ""

    def reset(self, task: Task) -> Start:
        for path, content in task.files.items():
            self.ctx.sandbox.write_file(f"/sandbox/{path}", content)
        return Start(first_messages(task, self.ctx.agent))

    def step(self, reply: str, last: bool) -> Step:
        cfg, action = self.ctx.agent, parse_action(reply)
        if action.code:
            self.code = action.code
        if last:
            return Step(done=True, end="max-turns")
        # a run may take `run_s`, and never past the episode's deadline
        left = self.ctx.time_left()
        run_s = max(0.05, min(cfg.run_s, left))
        outcome = run_action(self.ctx.sandbox, self.ctx.task, action.code, run_s) if action.code else Outcome()
        if run_s < cfg.run_s and outcome.limit == "wall_time":
            return Step(done=True, end="deadline", outcome=outcome)
        if action.code and outcome.all_pass and cfg.stop_when_examples_pass:
            return Step(done=True, end="examples-pass", outcome=outcome)
        return Step(describe(outcome, bool(action.code)), outcome=outcome)

    def final(self) -> Final:
        return Final(as_completion(self.ctx.task.prompt, self.code))

    def verify(self, final: Final) -> object:
        return self.ctx.verifier.verify(self.ctx.task, final.completion)

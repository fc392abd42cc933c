"""An environment of your own: arithmetic word problems with a calculator tool.

Copy this file next to your run config and name it in the config:

    [rollout.agent]
    environment = "calculator_env:CalculatorEnv"

(`sarl submit` imports it and checks its methods before anything is
submitted; run sarl from the folder that holds the file, or put it on
PYTHONPATH.) Each task is an ordinary task line: `prompt` is the question,
`tests` the expected answer as a number, e.g.

    {"task_id": "calc/1", "prompt": "A box holds 12 eggs. How many eggs are in 7 boxes?",
     "entry_point": "answer", "tests": "84", "environment": "calculator_env:CalculatorEnv"}

The interface (rl.agent.env): `reset(task)` gives the first messages and the
tools, `step(reply, last)` answers each reply, `final()` says what is
graded, `verify(final)` grades it: here as a dict of check scores, which
sarl turns into the reward with `verify.weights`. Anything a method raises
is recorded as an infrastructure failure of the episode, never trained on
as a reward of 0.
"""

from __future__ import annotations

import ast
import operator

from rl.agent.env import Environment, Final, Start, Step
from rl.agent.tools import Param, Tool, parse_calls
from rl.tasks.format import Task

TOOLS = [
    Tool(
        "calc",
        "Evaluate an arithmetic expression: + - * / // % ** and parentheses.",
        (Param("expression", "string", "e.g. (12 + 3) * 4"),),
    ),
    Tool("answer", "Give your final answer.", (Param("value", "number", "the answer"),)),
]

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def evaluate(expression: str) -> float:
    """Arithmetic only: numbers and operators, no names, no calls."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            right = ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](ev(node.left), right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("only numbers and + - * / // % ** are allowed")

    return ev(ast.parse(expression, mode="eval").body)


class CalculatorEnv(Environment):
    """Word problems; the policy may calculate, then answers."""

    given: float | None = None

    def reset(self, task: Task) -> Start:
        system = "Solve the problem. Use the calc tool for arithmetic, then call answer with the number."
        return Start([{"role": "system", "content": system}, {"role": "user", "content": task.prompt}], TOOLS)

    def step(self, reply: str, last: bool) -> Step:
        calls = parse_calls(reply, TOOLS, max_calls=4)
        lines, failures = [], []
        for call in calls:
            if call.failure:  # sloppy calls are observations with a reason, never exceptions
                failures.append(call.failure)
                lines.append(f"{call.failure}: {call.detail}")
            elif call.name == "answer":
                self.given = float(call.arguments["value"])
                return Step(done=True, end="submitted", failures=failures, calls=len(calls))
            else:
                try:
                    lines.append(f"{call.arguments['expression']} = {evaluate(call.arguments['expression'])}")
                except (ValueError, SyntaxError, ZeroDivisionError, OverflowError) as e:
                    lines.append(f"calc error: {e}")
        return Step("\n".join(lines), done=last, end="max-turns" if last else "", failures=failures, calls=len(calls))

    def final(self) -> Final:
        return Final("" if self.given is None else repr(self.given))

    def verify(self, final: Final) -> dict[str, float]:
        expected = float(self.ctx.task.tests)
        right = self.given is not None and abs(self.given - expected) <= 1e-6 * max(1.0, abs(expected))
        return {"tests": 1.0 if right else 0.0}

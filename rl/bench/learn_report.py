"""What `sarl bench learn` reports: the paired gain between two stages'
evaluations, and the printed table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def paired_gain(before: Path, after: Path, templates: dict[str, str]) -> dict[str, float]:
    """The per-task change of pass@1, in points, with its standard error:
    both evaluations ran on the same tasks, so the pairing removes the
    spread of task difficulty from the error. `se_templates` is the same
    error clustered by template (`templates`: task id -> template): the
    instances of one template pass or fail together, so it is the honest
    margin where a set has few templates; `templates` counts them."""
    from rl.eval.passk import clustered_se, mean_and_se

    def per_task(folder: Path) -> dict[str, float]:
        rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line]
        return {r["task_id"]: r["pass_at"]["pass@1"] for r in rows}

    b, a = per_task(before), per_task(after)
    ids = sorted(b.keys() & a.keys())
    diffs = [a[t] - b[t] for t in ids]
    m, se = mean_and_se(diffs)
    clusters = [templates.get(t, t) for t in ids]
    return {
        "points": round(100 * m, 2),
        "se": round(100 * se, 2),
        "se_templates": round(100 * clustered_se(diffs, clusters), 2),
        "templates": len(set(clusters)),
    }


def report_lines(r: dict[str, Any]) -> list[str]:
    """The benchmark's result as the lines it prints (learn.txt)."""

    def pct(v: Any) -> str:
        return "-" if v is None else f"{100 * v:.0f}%"

    m = r["minutes"]
    out = [
        "learn: pass@1 by stage (paired standard errors in points, by task and by template), "
        f"{m['all']:.1f} min in all "
        f"(SFT {m['sft']:.1f}, band {m['band']:.1f}, RL {m['rl']:.1f}, control {m['control']:.1f}, "
        f"evaluations {m['evals']:.1f}); up to {r['max_turns']} turns"
        + (" [--quick: not a measurement]" if r["quick"] else ""),
        "  sets: "
        + ", ".join(f"{k} {v}" for k, v in r["sets"].items())
        + f"; B: templates with a warm-start {r['band_by']} rate in [{r['band'][0]}, {r['band'][1]}]",
        f"  RL samples at T = {r['temperature']['chosen']}: the most candidates with signal; "
        + ", ".join(
            f"T = {t}: {x['with_signal']} of {x['tasks']} with signal, pass@1 {x['pass@1']:.3f}, "
            f"crash {pct(x['crash_share'])}"
            for t, x in r["temperature"]["measured"].items()
        ),  # fmt: skip
        "  leaks: templates (A + B vs U) "
        + str(r["leaks"]["templates"]["leaking_held_tasks"])
        + "; instances "
        + ", ".join(f"{k} {v['leaking_held_tasks']}" for k, v in r["leaks"]["instances"].items()),
        f"  {'':<26}" + "".join(f"{s:>16}" for s in ("base", "SFT", "SFT + RL", "control")),
    ]
    names = {"instances": "B' (fresh instances)", "templates": "U (unseen templates)", "humaneval": "HumanEval"}
    for where, modes in r["evals"].items():
        for mode, cells in modes.items():
            label = f"{names[where]} {mode}"
            out.append(f"  {label:<26}" + "".join(
                f"{c['pass@1']:.3f} +- {c['se@1']:.3f}".rjust(16) for c in cells.values()))  # fmt: skip
            out.append(f"  {'  reward / crash':<26}" + "".join(
                f"{c['reward_mean']:.2f} / {pct(c['crash_share'])}".rjust(16) for c in cells.values()))  # fmt: skip
            if r["max_turns"] > 1:  # of the episodes that failed turn 1, the share a second turn fixed
                out.append(f"  {'  turn 2 fix rate':<26}" + "".join(
                    pct(c["turn_2_fix_rate"]).rjust(16) for c in cells.values()))  # fmt: skip
            out.append("    " + "   ".join(
                f"{k.replace('_minus_', ' - ')} {g['points']:+.1f} +- {g['se']:.1f} ({g['se_templates']:.1f} by tmpl)"
                for k, g in r["gains"][where][mode].items()))  # fmt: skip
    out.append("  targets on B': rl - sft >= +10 points sampled and >= +5 greedy, each >= 2 se; rl - control >= 2 se;"
               " on U and HumanEval rl - sft not below -1 se")  # fmt: skip
    out.append(f"  runs, logs and TensorBoard: {r['folder']}")
    return out

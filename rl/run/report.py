"""`sarl report RUN_DIR`: a self-contained summary for people without a
TensorBoard tunnel.

    RUN_DIR/report/reward.png       reward over time (learner, each rollout worker)
    RUN_DIR/report/pass1.png        held-out pass@1 per weight version, +- 1 standard error, beside the
                                    training reward (and the control's, with `--control`)
    RUN_DIR/report/failures.png     rollout failures by reason, cumulative over time
    RUN_DIR/report/throughput.png   episodes/s, learner tokens/s, generator tokens/s
    RUN_DIR/report/learning.png     could the steps teach anything: the share of groups whose rewards
                                    differ, and how far the weights have moved from the run's start
    RUN_DIR/report/policy.png       the policy's entropy, reply length and gradient norm per learner step
    RUN_DIR/report/agent.png        what the agent does with its turns: crash share, share reaching turn 2,
                                    turn-2 fix rate (each rollout worker)
    RUN_DIR/report/control.png      reward per learner step beside a control run's (`--control`), e.g.
                                    the same run with `learner.shuffle_rewards`
    RUN_DIR/report/index.html       one page: the figures at a glance and the eight plots, embedded
    RUN_DIR/report/summary.txt      the figures at a glance, as text

Curves come from the run's TensorBoard event files (`RUN_DIR/tb/*`); the
time axis is minutes since the run's first event, shared by every role. A
plot with no data says so instead of being left out, so the page always
has the same shape.
"""

from __future__ import annotations

import base64
import html
import io
from collections import defaultdict
from pathlib import Path
from typing import Any

Series = dict[str, list[tuple[float, int, float]]]
"""tag -> [(wall time, step, value)] of one writer folder."""


def read_curves(tb_root: Path) -> dict[str, Series]:
    """Every writer folder under `tb_root` (learner, rollout-000000, eval, ...)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, Series] = {}
    if not tb_root.is_dir():
        return out
    for folder in sorted(p for p in tb_root.iterdir() if p.is_dir()):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        tags = acc.Tags().get("scalars", [])
        if tags:
            out[folder.name] = {t: [(e.wall_time, e.step, e.value) for e in acc.Scalars(t)] for t in tags}
    return out


def _t0(curves: dict[str, Series]) -> float:
    times = [p[0] for s in curves.values() for pts in s.values() for p in pts]
    return min(times) if times else 0.0


def _empty(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} yet", ha="center", va="center", transform=ax.transAxes, color="gray")


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def _by_step(series: list[tuple[float, int, float]]) -> tuple[list[int], list[float]]:
    """A learner curve by step, the last value of a step that was written twice (a step redone after a restart)."""
    last = {p[1]: p[2] for p in sorted(series)}
    steps = sorted(last)
    return steps, [last[k] for k in steps]


def plots(curves: dict[str, Series], control: dict[str, Series] | None = None) -> dict[str, bytes]:
    """Every figure of the report, as PNG bytes by name; `control`: the
    curves of a control run, drawn beside this run's where they compare."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a login node
    import matplotlib.pyplot as plt

    t0 = _t0(curves)
    return {
        "reward": _reward(plt, curves, t0),
        "pass1": _pass1(plt, curves, control),
        "failures": _failures(plt, curves, t0),
        "throughput": _throughput(plt, curves, t0),
        "learning": _learning(plt, curves.get("learner", {})),
        "policy": _policy(plt, curves.get("learner", {})),
        "agent": _agent(plt, curves, t0),
        "control": _control(plt, curves, control),
    }


def _line(ax: Any, pts: list[tuple[float, int, float]], t0: float, label: str, **kw: Any) -> None:
    """A curve against the minutes since the run's first point."""
    ax.plot([(p[0] - t0) / 60 for p in pts], [p[2] for p in pts], label=label, **kw)


def _done(plt: Any, fig: Any) -> bytes:
    png = _png(fig)
    plt.close(fig)
    return png


def _reward(plt: Any, curves: dict[str, Series], t0: float) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    drawn = 0
    for name, s in curves.items():
        for tag in ("learner/reward_mean", "rollout/reward_mean"):
            if tag in s:
                _line(ax, s[tag], t0, name, marker="." if name == "learner" else None)
                drawn += 1
    ax.set(title="Reward", xlabel="minutes", ylabel="mean reward")
    ax.legend(fontsize=7) if drawn else _empty(ax, "reward")
    return _done(plt, fig)


def _pass1(plt: Any, curves: dict[str, Series], control: dict[str, Series] | None) -> bytes:
    """The learning as it happens: held-out pass@1 per weight version, beside
    the training reward (version k is published by learner step k), for this
    run and the control."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    drawn = 0
    for label, c, style in (("this run", curves, "-"), ("control", control or {}, "--")):
        ev = c.get("eval", {})
        if "eval/pass@1" in ev:
            pts = sorted((p[1], p[2]) for p in ev["eval/pass@1"])
            se = {p[1]: p[2] for p in ev.get("eval/se@1", [])}
            ax.errorbar([v for v, _ in pts], [y for _, y in pts], yerr=[se.get(v, 0.0) for v, _ in pts], marker="o",
                        capsize=3, linestyle=style, label=f"held-out pass@1, {label}")  # fmt: skip
            drawn += 1
        if drawn and "learner/reward_mean" in c.get("learner", {}):
            ax.plot(*_by_step(c["learner"]["learner/reward_mean"]), linestyle=style, color="gray", alpha=0.7,
                    label=f"training reward, {label}")  # fmt: skip
    if drawn:
        ax.legend(fontsize=7)
    else:
        _empty(ax, "evaluation")
    ax.set(title="Held-out pass@1 (+- 1 standard error) beside the training reward", xlabel="weight version",
           ylabel="pass@1, mean reward")  # fmt: skip
    return _done(plt, fig)


def _failures(plt: Any, curves: dict[str, Series], t0: float) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    by_reason: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s in curves.values():
        for tag, series in s.items():
            if tag.startswith("rollout/failures/"):
                by_reason[tag.rsplit("/", 1)[1]] += [(p[0], p[2]) for p in series]
    for why, events in sorted(by_reason.items()):
        events.sort()
        total, xs, ys = 0.0, [], []
        for t, v in events:
            total += v
            xs.append((t - t0) / 60)
            ys.append(total)
        ax.step(xs, ys, where="post", label=why)
    ax.set(title="Rollout failures by reason (cumulative)", xlabel="minutes", ylabel="episodes")
    ax.legend(fontsize=7) if by_reason else _empty(ax, "failed episode")
    return _done(plt, fig)


def _throughput(plt: Any, curves: dict[str, Series], t0: float) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax2 = ax.twinx()
    drawn = 0
    for name, s in curves.items():
        if "rollout/episodes_per_s" in s:
            _line(ax, s["rollout/episodes_per_s"], t0, f"{name} episodes/s")
            drawn += 1
        for tag in ("learner/tokens_per_s", "generator/tokens_per_s"):
            if tag in s:
                _line(ax2, s[tag], t0, f"{name} {tag.split('/')[0]} tokens/s", linestyle="--")
                drawn += 1
    ax.set(title="Throughput", xlabel="minutes", ylabel="episodes/s")
    ax2.set_ylabel("tokens/s (dashed)")
    if drawn:
        handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
        ax.legend(handles=handles, fontsize=7)
    else:
        _empty(ax, "throughput")
    return _done(plt, fig)


def _learning(plt: Any, lc: Series) -> bytes:
    """Could the steps teach anything: the groups with signal, and how far the weights moved."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax2 = ax.twinx()
    for tag, axis, label in (("learner/groups_with_signal", ax, "groups with reward variance (share)"),
                             ("learner/weight_change", ax2, "||w - w0|| / ||w0|| (dashed, log)")):  # fmt: skip
        if tag in lc:
            pts = sorted((p[1], p[2]) for p in lc[tag])
            axis.plot([x for x, _ in pts], [y for _, y in pts], label=label, marker=".",
                      linestyle="--" if axis is ax2 else "-")  # fmt: skip
    if "learner/weight_change" in lc and any(p[2] > 0 for p in lc["learner/weight_change"]):
        ax2.set_yscale("log")
    ax.set(title="Could the steps teach anything?", xlabel="learner step", ylabel="share of groups", ylim=(0, 1.05))
    ax2.set_ylabel("relative weight change")
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=7) if handles else _empty(ax, "learner step")
    return _done(plt, fig)


def _policy(plt: Any, lc: Series) -> bytes:
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2))
    for ax, (tag, title) in zip(axes, POLICY_CURVES, strict=True):
        if tag in lc:
            ax.plot(*_by_step(lc[tag]), marker=".")
        else:
            _empty(ax, "learner step")
        ax.set(title=title, xlabel="learner step")
    fig.tight_layout()
    return _done(plt, fig)


def _agent(plt: Any, curves: dict[str, Series], t0: float) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    drawn = 0
    for name, s in curves.items():
        for tag, label, style in AGENT_CURVES:
            if tag in s:
                _line(ax, s[tag], t0, f"{name} {label}", linestyle=style)
                drawn += 1
    ax.set(title="What the agent does with its turns", xlabel="minutes", ylabel="share of episodes", ylim=(-0.02, 1.02))
    ax.legend(fontsize=7) if drawn else _empty(ax, "rollout batch")
    return _done(plt, fig)


def _control(plt: Any, curves: dict[str, Series], control: dict[str, Series] | None) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    drawn = 0
    for label, c in (("this run", curves), ("control", control or {})):
        if "learner/reward_mean" in c.get("learner", {}):
            ax.plot(*_by_step(c["learner"]["learner/reward_mean"]), marker=".", label=label)
            drawn += 1
    ax.set(title="Reward per learner step, beside the control", xlabel="learner step", ylabel="mean reward")
    if control is None:
        ax.text(0.5, 0.3, "no control run given (sarl report RUN_DIR --control CONTROL_RUN_DIR)", ha="center",
                va="center", transform=ax.transAxes, color="gray")  # fmt: skip
    if drawn:
        ax.legend(fontsize=7)
    elif control is not None:
        _empty(ax, "learner step")
    return _done(plt, fig)


AGENT_CURVES = (("rollout/crash_share", "crash share", ":"), ("rollout/turn_2_share", "reached turn 2", "--"),
                ("rollout/turn_2_fix_rate", "turn-2 fix rate", "-"))  # fmt: skip
POLICY_CURVES = (("learner/entropy", "entropy (per sampled token)"), ("learner/response_len", "reply length (tokens)"),
                 ("learner/grad_norm", "gradient norm (before clipping)"))  # fmt: skip


def against_control(curves: dict[str, Series], control: dict[str, Series], last: int = 5) -> list[str]:
    """The run's and the control's mean reward over their last `last` learner
    steps, and the steps each took: the figure the control is for."""

    def tail(c: dict[str, Series]) -> tuple[float, int] | None:
        pts = c.get("learner", {}).get("learner/reward_mean")
        if not pts:
            return None
        steps, values = _by_step(pts)
        return sum(values[-last:]) / len(values[-last:]), steps[-1]

    mine, theirs = tail(curves), tail(control)
    if mine is None or theirs is None:
        return [f"reward against the control: {'this run' if mine is None else 'the control'} has no learner step yet"]
    return [
        f"mean reward over the last {last} learner steps: this run {mine[0]:.3f} (step {mine[1]}), "
        f"control {theirs[0]:.3f} (step {theirs[1]}), difference {mine[0] - theirs[0]:+.3f}"
    ]


def glance(status: dict[str, Any], curves: dict[str, Series]) -> list[str]:
    from rl.run.overview import render_overview

    lines = [f"run {status['name']} ({status['run_dir']})", *render_overview(status.get("training", {}))]
    ev = curves.get("eval", {})
    if "eval/pass@1" in ev:
        pts = sorted((p[1], p[2]) for p in ev["eval/pass@1"])
        se = {p[1]: p[2] for p in ev.get("eval/se@1", [])}
        (v0, p0), (v1, p1) = pts[0], pts[-1]
        lines.append(
            f"held-out pass@1: version {v0} {p0:.3f} +- {se.get(v0, 0):.3f} -> version {v1} {p1:.3f} +- "
            f"{se.get(v1, 0):.3f}"
        )
    for name, r in status["roles"].items():
        c = r["counts"]
        n = r["tasks"]
        lines.append(
            f"{name}: {n} task{'s' if n != 1 else ''}, {c['done']} done, {c['running']} running, {c['failed']} failed"
        )
    return lines


def write_report(run_dir: Path, out_dir: Path | None = None, control_dir: Path | None = None) -> Path:
    """The report of `run_dir`; with `control_dir`, a control run (the same
    config with `learner.shuffle_rewards`, or any run to compare with) is
    drawn beside it."""
    from rl.fsio import atomic_write
    from rl.run.rundir import RunDir
    from rl.run.status import run_status

    rd = RunDir(run_dir)
    folder = out_dir or rd.path / "report"
    folder.mkdir(parents=True, exist_ok=True)
    curves = read_curves(rd.curves_path)
    status = run_status(rd, store=False)
    lines = glance(status, curves)
    control = None
    if control_dir is not None:
        control = read_curves(RunDir(control_dir).curves_path)
        lines += against_control(curves, control)
    images = plots(curves, control)
    for name, data in images.items():
        (folder / f"{name}.png.tmp").write_bytes(data)
        (folder / f"{name}.png.tmp").replace(folder / f"{name}.png")
    body = "".join(f"<li>{html.escape(x)}</li>" for x in lines)
    figs = "".join(
        f'<figure><img alt="{n}" src="data:image/png;base64,{base64.b64encode(d).decode()}"></figure>'
        for n, d in images.items()
    )
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>sarl report: {html.escape(status['name'])}</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}img{max-width:100%}</style></head>"
        f"<body><h1>sarl report: {html.escape(status['name'])}</h1><ul>{body}</ul>{figs}</body></html>\n"
    )
    atomic_write(folder / "index.html", page)
    atomic_write(folder / "summary.txt", "\n".join(lines) + "\n")
    return folder

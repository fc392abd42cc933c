"""The training run at a glance, for `sarl status`: the learner's step and
published version, each generator's version, rollouts committed and
waiting, episodes/s, staleness, failures by reason, the last evaluation.

Everything comes from committed role states and the store's version list
(cheap reads: no batch is opened), so it answers on a login node while the
run goes on; a role that has not committed yet is simply absent.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rl.fsio import read_json
from rl.run.rundir import RunDir


def _states(rd: RunDir, role: str, tasks: int) -> list[dict[str, Any]]:
    out = []
    for t in range(tasks):
        try:
            s = read_json(rd.state_path(role, t))
        except Exception:  # a torn or unreadable state: that task is shown as not reporting
            s = None
        if s:
            out.append(s)
    return out


def overview(rd: RunDir, cfg: Any, learner_running: bool) -> dict[str, Any]:
    """`learner_running`: whether the learner's task runs now; an ETA is
    given only then (a cancelled or failed run finishes never)."""
    out: dict[str, Any] = {}
    try:
        from rl.store.weights import WeightStore

        published = WeightStore(rd.store_path).latest() if rd.store_path.is_dir() else None
    except Exception:  # a damaged store is reported by the store section of status
        published = None
    if cfg.learner is not None:
        out["learner"] = _learner((_states(rd, "learner", 1) or [{}])[0], cfg.learner, published, learner_running)
    if cfg.generator is not None:
        gens = _states(rd, "generator", cfg.generator.workers)
        out["generators"] = {str(s.get("task", i)): s.get("version") for i, s in enumerate(gens)}
    if cfg.rollout is not None:
        ws = _states(rd, "rollout", cfg.rollout.workers)
        fails: Counter[str] = Counter()
        for s in ws:
            fails.update(s.get("failures", {}))
        committed = sum(s.get("batches", 0) for s in ws)
        consumed = out.get("learner", {}).get("batches_consumed", 0)
        out["rollouts"] = {
            "episodes_committed": sum(s.get("episodes_committed", 0) for s in ws),
            "episodes_total": cfg.rollout.groups * cfg.rollout.group_size,
            "batches_committed": committed,
            "batches_waiting": max(0, committed - consumed) if cfg.learner is not None else None,
            "episodes_per_s": round(sum(s.get("rate", 0.0) for s in ws if not s.get("done")), 3),
            "groups_abandoned": sum(len(s.get("abandoned", {})) for s in ws),
            "failures": dict(sorted(fails.items())),
        }
    if cfg.eval is not None:
        s = (_states(rd, "eval", 1) or [{}])[0]
        if "last_version" in s:
            out["last_eval"] = {"version": s["last_version"], **s.get("last", {})}
    return out


FIGURES = {
    "sft": ("loss", "tokens_per_s"),
    "rl": ("reward_mean", "groups_with_signal", "staleness", "mismatch_kl", "loss"),
}
"""The learner's figures that mean something for each kind of run (an SFT
run has no reward to speak of, nor a behaviour policy to differ from)."""


def _learner(s: dict[str, Any], lc: Any, published: int | None, running: bool) -> dict[str, Any]:
    kind = "sft" if lc.loss.type == "sft" else "rl"
    step = s.get("step", 0)
    pace = s.get("pace_s")
    return {
        "kind": kind,
        "step": step,
        "steps": lc.steps,
        "seconds_per_step": pace,
        "eta_s": round(pace * (lc.steps - step), 1) if running and pace and step < lc.steps else None,
        "published_version": published or 0,
        "batches_consumed": s.get("batches", 0),
        **{k: s.get(k) for k in FIGURES[kind]},
        "dropped_stale": s.get("dropped_stale") if kind == "rl" else None,
        "quarantined_batches": len(s.get("quarantined", {})),
        "ended_early": s.get("ended", ""),
    }


def duration(s: float) -> str:
    """`45 s`, `12 min`, `3.5 h`."""
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


_NAMES = {"reward_mean": "reward", "groups_with_signal": "groups with signal", "tokens_per_s": "tokens/s"}


def render_overview(ov: dict[str, Any]) -> list[str]:
    lines = []
    if "learner" in ov:
        x = ov["learner"]
        figures = ", ".join(
            f"{_NAMES.get(k, k.replace('_', ' '))} {x[k]:.4g}" for k in FIGURES[x["kind"]] if x.get(k) is not None
        )
        pace = f" ({x['seconds_per_step']:.0f} s/step" if x.get("seconds_per_step") else ""
        pace += (f", ETA {duration(x['eta_s'])})" if x.get("eta_s") else ")") if pace else ""
        lines.append(
            f"learner     {x['kind'].upper()}, step {x['step']}/{x['steps']}{pace}, "
            f"published version {x['published_version']}, "
            f"{x['batches_consumed']} batches consumed" + (f"; {figures}" if figures else "")
            + (f"; {x['quarantined_batches']} batches quarantined" if x["quarantined_batches"] else "")
            + (f"; ended early: {x['ended_early']}" if x.get("ended_early") else "")
        )  # fmt: skip
    if ov.get("generators"):
        lines.append("generators  " + ", ".join(f"task {t}: version {v}" for t, v in ov["generators"].items()))
    if "rollouts" in ov:
        r = ov["rollouts"]
        waiting = f", {r['batches_waiting']} waiting for the learner" if r["batches_waiting"] is not None else ""
        fails = ", ".join(f"{k} {v}" for k, v in r["failures"].items()) or "none"
        lines.append(
            f"rollouts    {r['episodes_committed']}/{r['episodes_total']} episodes "
            f"in {r['batches_committed']} batches{waiting}, "
            f"{r['episodes_per_s']}/s, {r['groups_abandoned']} groups abandoned; failures: {fails}"
        )
    if "last_eval" in ov:
        e = ov["last_eval"]
        figures = ", ".join(f"{k} {v:.3f}" for k, v in e.items() if k.startswith(("pass@", "se@")))
        lines.append(f"eval        version {e['version']}: {figures or e.get('skipped', '')}")
    return lines

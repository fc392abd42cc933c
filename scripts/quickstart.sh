#!/usr/bin/env bash
# The main job on the local default: post-train SmolLM2-135M-Instruct on
# generated Python tasks and show held-out pass@1 before and after.
#   1. install sarl (.venv, the CPU extras) and bubblewrap;
#   2. generate 500 tasks in 13 families and hold whole templates out
#      (146 tasks), checked to share no template, reference program
#      or near-duplicate prompt with the training tasks;
#   3. a warm start: SFT on the training tasks' references (learner only);
#   4. RL from it: a vLLM generator, a rollout worker playing the agent in
#      sandboxes, and the learner, on the same training tasks;
#   5. evaluate the base model, the warm start and the RL model on the
#      held-out tasks (greedy, one sample per task) and print each, with
#      what each stage gave (paired standard errors).
# About 15 minutes on 2 cores, 0.85 GB in runs/ (LoRA adapters under bf16
# where the CPU has it; docs/benchmarks.md: sarl bench learn).
# Runs go to runs/; a second call resumes them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh cpu
if ! command -v bwrap >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq bubblewrap >/dev/null
fi
sarl=.venv/bin/sarl
tasks=runs/quickstart/tasks
if [ ! -f "$tasks.heldout.jsonl" ]; then
  mkdir -p runs/quickstart
  $sarl tasks generate --family all -n 500 --seed 1 -o "$tasks.jsonl"
  $sarl tasks split "$tasks.jsonl" --held-out 0.3 --seed 1      # by whole templates: 354 to train on, 146 held out
fi
$sarl tasks leaks "$tasks.train.jsonl" "$tasks.heldout.jsonl"    # exits 1 (and stops here) if any held-out task leaks
$sarl submit examples/quickstart-sft.toml --cluster local
$sarl status runs/quickstart-sft --wait
[ -d runs/quickstart-sft/model ] || $sarl export runs/quickstart-sft -o runs/quickstart-sft/model
$sarl submit examples/quickstart-rl.toml --cluster local
$sarl status runs/quickstart-rl --wait
# greedy, one reply of up to 256 tokens per task, every task at once (what sarl bench learn measures)
greedy=(--tasks "$tasks.heldout.jsonl" --temperature 0 -n 1 --max-turns 1 --max-tokens 256 --concurrency 64)
$sarl eval runs/quickstart-sft --version 0 "${greedy[@]}" --json > runs/quickstart/base.json   # the base model
$sarl eval runs/quickstart-rl --version 0 "${greedy[@]}" --json > runs/quickstart/sft.json     # the warm start RL began from
$sarl eval runs/quickstart-rl "${greedy[@]}" --json > runs/quickstart/rl.json                  # after RL
$sarl report runs/quickstart-rl > /dev/null
.venv/bin/python - <<'PY'
import json
from pathlib import Path

got = {w: json.load(open(f"runs/quickstart/{w}.json")) for w in ("base", "sft", "rl")}


def per_task(w):
    rows = (Path(got[w]["folder"]) / "results.jsonl").read_text().splitlines()
    return {r["task_id"]: r["pass_at"]["pass@1"] for r in map(json.loads, filter(None, rows))}


def gain(a, b):  # mean and standard error of the per-task difference: paired by task
    x, y = per_task(a), per_task(b)
    d = [x[t] - y[t] for t in sorted(x.keys() & y.keys())]
    m = sum(d) / len(d)
    se = (sum((v - m) ** 2 for v in d) / (len(d) - 1) / len(d)) ** 0.5 if len(d) > 1 else 0.0
    return f"{100 * m:+.1f} +- {100 * se:.1f} points"


print(f"held-out pass@1 on {got['rl']['tasks']} generated tasks of templates no run trained on (greedy):")
for w, what in (("base", "the base model"), ("sft", "SFT warm start"), ("rl", "SFT warm start + RL")):
    print(f"  {what:<22} {got[w]['pass@1']:.3f} +- {got[w]['se@1']:.3f}")
print(f"  the warm start gave {gain('sft', 'base')}; RL gave {gain('rl', 'sft')} on top of it (paired se)")
print("  (sarl bench learn adds a shuffled-reward control and HumanEval)")
PY
echo "TensorBoard: .venv/bin/tensorboard --logdir runs/quickstart-rl/tb  (and runs/quickstart-sft/tb)"
echo "report: runs/quickstart-rl/report/index.html; per-task results: runs/quickstart-*/eval/"

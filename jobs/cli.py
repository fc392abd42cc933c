"""The `sarl` command: one parser, one dispatch table.

Each command group is a module of `jobs/` (`GROUPS`) whose `add_commands`
adds its subcommands and names each one's handler (`set_defaults(handler=...)`);
`main` calls the handler that the parser chose. Group modules import only the
standard library at the top and the heavy libraries inside their handlers,
so that `sarl --help` stays fast on a login node.

Errors a user can cause (`rl.errors.SarlError`, and the sandboxes'
`SandboxError`) end in a one-paragraph message on stderr and a non-zero exit;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

GROUPS = (
    "jobs.cli_run",  # submit, status, cancel, resume, scale, report, export
    "jobs.cli_config",  # config show, config schema
    "jobs.cli_store",  # store inspect
    "jobs.cli_sandbox",  # sandbox run
    "jobs.cli_tasks",  # tasks import, generate, traces, split, leaks, sets, band, validate, report, schema
    "jobs.cli_generate",  # generate
    "jobs.cli_serve",  # serve
    "jobs.cli_verify",  # verify
    "jobs.cli_eval",  # eval
    "jobs.cli_bench",  # bench store, sandbox, verify, generate, submit
    "jobs.cli_chaos",  # chaos
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sarl", description="Agent RL on Slurm: submit and watch runs.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for name in GROUPS:
        importlib.import_module(name).add_commands(sub)
    return p


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # `kill`, a closed terminal or a time limit end the command as an exit does: what it
    # started is closed on the way out (a vLLM engine runs in processes of its own, which
    # Python's default SIGTERM would leave running, holding GBs). SIGKILL cannot be caught.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    from jobs.output import json_stdout
    from rl.errors import ConfigError, SarlError
    from sandboxes.base import SandboxError

    command = " ".join(x for x in (args.cmd, *(getattr(args, a, None) for a in _ACTIONS)) if isinstance(x, str))
    try:
        if getattr(args, "json", False):
            with json_stdout():
                return int(args.handler(args))
        return int(args.handler(args))
    except ConfigError as e:
        print(f"sarl {command}: config error:\n{e}", file=sys.stderr)
        return e.exit_code
    except SarlError as e:
        print(f"sarl {command}: {e}", file=sys.stderr)
        return e.exit_code
    except SandboxError as e:
        print(f"sarl {command}: sandbox: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


_ACTIONS = ("config_cmd", "store_cmd", "sandbox_cmd", "tasks_cmd", "bench_cmd")
"""The `dest` of each group's second-level subparser: named in error messages."""


def add_overrides(q: argparse.ArgumentParser) -> None:
    """--set KEY=VALUE and --cluster: the options of every command that reads a run config."""
    q.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (TOML value), e.g. --set smoke.steps=20; repeatable",
    )
    q.add_argument("--cluster", choices=("local", "slurm"), help="where jobs run; replaces executor.type of the config")


if __name__ == "__main__":
    sys.exit(main())

"""The `polar` command: one argparse tree, the top layer (it may import everything; nothing imports
it). Each command is a module here with ``add_arguments(parser)`` and ``run(args) -> int``
(``rollout``, ``proxy_serve``, ``doctor``, ``tasks_build``, ...); this file lists them.

Only the chosen command's module is imported, so ``polar view`` does not pay for the proxy's imports.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    module: str | None = None  # has add_arguments(parser) and run(args)
    children: tuple[Command, ...] = ()  # a command group (``polar proxy serve``)


COMMANDS = (
    Command(
        "demo",
        "the whole pipeline on the embedded default: harness, sandbox, proxy, model, grading",
        "polar_env.cli.demo",
    ),
    Command(
        "proxy",
        "run the token-capturing proxy (polar proxy serve --help)",
        children=(
            Command("serve", "run the proxy standalone against any backend", "polar_env.cli.proxy_serve"),
        ),
    ),
    Command(
        "check",
        "check trajectories / NeMo-RL results / GRPO batches (contract, groups, fidelity)",
        "polar_env.cli.check",
    ),
    Command(
        "export",
        "trajectories as an SFT dataset TRL's SFTTrainer or NeMo-RL's SFT reads as is (token ids, "
        "assistant-only loss masks, every chain)",
        "polar_env.cli.export",
    ),
    Command(
        "doctor",
        "report installed harnesses and sandboxes and how to fix what is missing",
        "polar_env.cli.doctor",
    ),
    Command(
        "rollout",
        "K rollouts per task with a real harness in sandboxes, through the proxy, graded",
        "polar_env.cli.rollout",
    ),
    Command("eval", "grade SWE-bench predictions on bundled, Verified or custom tasks", "polar_env.cli.eval"),
    Command(
        "tasks",
        "bring your own tasks: build one from a row and its base tree, validate a task file",
        children=(
            Command(
                "build",
                "a task from a SWE-bench-schema row and its base tree: derive FAIL_TO_PASS/PASS_TO_PASS",
                "polar_env.cli.tasks_build",
            ),
            Command(
                "validate",
                "check every task of a file: environment, test patch, gold resolves, empty patch does not",
                "polar_env.cli.tasks_validate",
            ),
            Command(
                "export",
                "write tasks (bundled, JSONL, Harbor, datasets) as Harbor task folders",
                "polar_env.cli.tasks_export",
            ),
            Command(
                "audit",
                "run the known ways to control a task's reward without solving it against "
                "each task; a verdict per task (polar rollout warns on controllable ones)",
                "polar_env.cli.tasks_audit",
            ),
            Command(
                "pull",
                "pre-pull every image a task file names (bounded, retried on rate limits, "
                "pruned to a disk budget)",
                "polar_env.cli.tasks_pull",
            ),
        ),
    ),
    Command(
        "train",
        "one machine, the embedded model: SFT warm start on gold replays, then GRPO through real "
        "harness episodes; checkpoints and a reward plot",
        "polar_env.cli.train",
    ),
    Command(
        "view",
        "write (or serve) the HTML page of trajectories: tokens by loss mask, logprobs, grading",
        "polar_env.cli.view",
    ),
    Command(
        "bench",
        "measure the proxy against direct and LiteLLM; write docs/benchmarks.md",
        "polar_env.cli.bench",
    ),
    Command(
        "policy-server",
        "a local stand-in policy server (vLLM /v1/completions wire) for NeMo Gym runs",
        "polar_env.cli.policy_server",
    ),
)


def _add_commands(parser: argparse.ArgumentParser, commands: tuple[Command, ...], argv: list[str]) -> None:
    """Subparsers for ``commands``; only the one ``argv`` names gets its flags (its module imported)."""
    sub = parser.add_subparsers(dest=f"command_{parser.prog.count(' ')}", metavar="COMMAND", required=True)
    chosen = argv[0] if argv else None
    for command in commands:
        child = sub.add_parser(command.name, help=command.help, description=command.help)
        if command.name != chosen:
            continue
        if command.children:
            _add_commands(child, command.children, argv[1:])
        else:
            assert command.module is not None  # a command without children names its module
            module = importlib.import_module(command.module)
            module.add_arguments(child)
            child.set_defaults(run=module.run, command_parser=child)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="polar",
        description="Polar: RL rollouts of coding agents through "
        "their unmodified harnesses, captured token by token.",
    )
    _add_commands(parser, COMMANDS, argv)
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed; with ``--settings FILE``, the file's settings are the defaults the flags override."""
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if getattr(args, "settings", None) is not None:
        from polar_env.cli.settings import SettingsFileError, read_settings_file

        try:
            fragment = read_settings_file(args.settings, args.settings_model)
        except SettingsFileError as exc:
            args.command_parser.error(str(exc))  # exits
            raise
        args.command_parser.set_defaults(**fragment)
        args = parser.parse_args(argv)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    args.argv = argv  # the command line as given (recorded by `polar bench`)
    return args.run(args)

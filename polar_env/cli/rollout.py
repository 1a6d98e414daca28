"""`polar rollout` (and the flags `polar demo` shares): flags in, a RolloutConfig out, the job run."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import polar_env.rollout
from polar_env.backends.logprobs_mode import LogprobsMismatch
from polar_env.cli.settings import add_proxy_arguments, add_settings_argument, settings_from_args
from polar_env.episodes.workspace import SANDBOX_CHOICES
from polar_env.harness_adapters.registry import adapter_names, harness_choices
from polar_env.outcomes import FailureKind, Outcome, parse_outcome
from polar_env.rollout.config import RolloutConfig, host_port
from polar_env.tasks.loader import TaskLoadError
from polar_env.tasks.runtime import WorkspaceUnavailable


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of a rollout job (`polar demo` has them too); their names are RolloutConfig's fields."""
    d = RolloutConfig()
    add_settings_argument(parser, RolloutConfig)
    parser.add_argument(
        "--harness",
        default=d.harness,
        choices=harness_choices(),
        metavar="HARNESS",
        help=f"one of: {', '.join(adapter_names())} (docs/harnesses.md)",
    )
    parser.add_argument(
        "--sandbox",
        default=d.sandbox,
        choices=SANDBOX_CHOICES,
        help="where episodes run: auto (a bubblewrap tree for tasks with a base archive, a "
        "container of the task's image otherwise) or one engine for every task",
    )
    parser.add_argument(
        "--tasks",
        default=d.tasks,
        help="bundled | terminal | verified | FILE.jsonl | a Harbor task folder (or a folder of "
        "them) | a dataset NAME[:split] (docs/tasks.md)",
    )
    parser.add_argument(
        "--reward-key",
        default=d.reward_key,
        help="Harbor tasks: the reward.json key that is the reward (default: 'reward', else "
        "the only key; docs/tasks.md)",
    )
    parser.add_argument(
        "--refuse-controllable",
        action="store_true",
        default=d.refuse_controllable,
        help="refuse tasks whose reward `polar tasks audit` found the tested code can control "
        "(default: a warning)",
    )
    parser.add_argument("--task-ids", nargs="*", default=d.task_ids, help="only these instance ids")
    parser.add_argument("--limit", type=int, default=d.limit, help="only the first N tasks")
    add_proxy_arguments(parser, d)
    parser.add_argument(
        "--policy",
        default=d.policy,
        help="model (the backend samples) or a scripted policy scored by the local model: "
        "gold (replays the gold patch), gold-steps (the same in five tool-using calls), noop",
    )
    parser.add_argument(
        "--score-window",
        type=int,
        default=d.score_window,
        help="scripted policies: the model scores each answer given the last N prompt tokens",
    )
    parser.add_argument(
        "--samples", type=positive_int, default=d.samples, help="rollouts per task (GRPO group size)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=d.concurrency, help="model calls at once (the same as --run-slots)"
    )
    parser.add_argument(
        "--run-slots",
        type=int,
        default=d.run_slots,
        metavar="N",
        help="run stage: model calls at once, the inference concurrency (default: --concurrency)",
    )
    parser.add_argument(
        "--prepare-slots",
        type=int,
        default=d.prepare_slots,
        metavar="N",
        help="prepare stage: workspaces opened and harnesses started at once (default: run slots)",
    )
    parser.add_argument(
        "--grade-slots",
        type=int,
        default=d.grade_slots,
        metavar="N",
        help="finish stage: episodes graded at once (default: run slots)",
    )
    parser.add_argument(
        "--lookahead",
        type=int,
        default=d.lookahead,
        metavar="N",
        help="live harnesses beyond the run slots: prepared ahead, or in a tool while others' calls "
        "use the slots (default: run slots)",
    )
    parser.add_argument(
        "--collapsed",
        action="store_true",
        default=d.collapsed,
        help="hold one slot over every stage of an episode (the driver before stages; to compare)",
    )
    parser.add_argument("--out", type=out_dir, default=d.out, help="the job's directory (made if missing)")
    parser.add_argument("--timeout", type=float, default=d.timeout, help="harness deadline per episode (s)")
    parser.add_argument("--grading-timeout", type=float, default=d.grading_timeout)
    parser.add_argument("--temperature", type=float, default=d.temperature)
    parser.add_argument("--top-p", type=float, default=d.top_p)
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens, help="per model call")
    parser.add_argument(
        "--max-calls",
        type=int,
        default=d.max_calls,
        help="per-episode budget: model calls the proxy answers before refusing (docs/proxy.md)",
    )
    parser.add_argument(
        "--max-sampled-tokens",
        type=int,
        default=d.max_sampled_tokens,
        help="per-episode budget: tokens sampled over all of an episode's calls",
    )
    parser.add_argument(
        "--outcome",
        action=OutcomeRows,
        default=d.outcome,
        type=_outcome_arg,
        metavar="KIND=mask|REWARD",
        help="override a row of the outcome table (docs/outcomes.md), e.g. harness_crashed=mask",
    )
    parser.add_argument(
        "--min-backend-tokens-per-s",
        type=float,
        default=d.min_backend_tokens_per_s,
        help="a deadline hit while the backend sampled slower than this is masked, not the policy's",
    )
    parser.add_argument(
        "--train-paths",
        default=d.train_paths,
        metavar="all|main|final|MODULE:FUNCTION",
        help="which chains of an episode become training rows (docs/training.md)",
    )
    parser.add_argument(
        "--max-staleness",
        type=int,
        default=d.max_staleness,
        metavar="K",
        help="start an episode only while the policy lag is within K versions (docs/training.md)",
    )
    parser.add_argument(
        "--admin",
        default=d.admin,
        metavar="HOST:PORT",
        type=_admin_arg,
        help="serve the proxy's admin API there too (pause, resume, the policy version: "
        "docs/training.md); printed at start",
    )
    parser.add_argument(
        "--mask-single-call",
        action="store_true",
        default=d.mask_single_call,
        help="mask rollouts whose harness made one model call (degenerate; polar check counts them)",
    )
    add_watch_arguments(parser)


def _admin_arg(value: str) -> str:
    try:
        return host_port(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_watch_arguments(parser: argparse.ArgumentParser) -> None:
    """How to watch the job while it runs (rollout/watch.py, docs/rollout.md "Watching a run")."""
    parser.add_argument(
        "--metrics-port",
        default=None,
        metavar="[HOST:]PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics while the job runs (HOST "
        "default 127.0.0.1; PORT 0: any free port, printed)",
    )
    parser.add_argument(
        "--report-to",
        action="append",
        default=[],
        choices=["tensorboard", "wandb"],
        help="log the figures (summary.json / metrics.jsonl keys) to TensorBoard (OUT/tensorboard) "
        "or Weights & Biases (repeatable; needs the package)",
    )
    parser.add_argument(
        "--gpus",
        type=positive_int,
        default=None,
        metavar="N",
        help="GPUs the inference backend holds: summary.json's accepted work per GPU-hour",
    )


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more (got {number})")
    return number


def out_dir(value: str) -> Path:
    """``--out``: a directory (made if missing), never an existing file."""
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{value} is a file; --out names the job's directory (e.g. runs/demo)"
        )
    return path


class OutcomeRows(argparse.Action):
    """``--outcome KIND=VALUE``, repeatable: each a row over the ones before it (a settings file's
    ``outcome`` mapping, then the flags in order)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        kind, row = values  # one _outcome_arg
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest, None) or {}), kind: row})


def _outcome_arg(item: str) -> tuple[FailureKind, Outcome]:
    try:
        return parse_outcome(item)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def config_from_args(args: argparse.Namespace) -> RolloutConfig:
    """The parsed flags as the typed config (flags other commands add are left out)."""
    return settings_from_args(RolloutConfig, args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = polar_env.rollout.__doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_job_arguments(parser)
    parser.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        default=None,
        metavar="ADDRESS",
        help="spread the episodes over this Ray cluster's nodes, each with its own proxy "
        "and sandboxes (no ADDRESS or 'auto': the cluster running on this machine)",
    )


def run(args: argparse.Namespace) -> int:
    from polar_env.rollout.outputs import masked_lines, summarize, summary_table, time_split
    from polar_env.rollout.plan import pending_episodes, plan_from_config
    from polar_env.rollout.runner import prepare, proxy_factory, run_rollouts
    from polar_env.rollout.watch import Watch, WatchUnavailable

    config = config_from_args(args)
    try:
        plan = plan_from_config(config)
        if not config.ray:
            prepare(plan)
        watch = Watch(config, plan.out, "polar rollout")
    except (TaskLoadError, WorkspaceUnavailable, WatchUnavailable) as exc:
        print(f"polar rollout: {exc}", file=sys.stderr)
        return 2
    with watch:
        try:
            if config.ray:
                from polar_env.rollout.ray import run_on_ray

                trajectories = run_on_ray(plan, config)
            else:
                trajectories = asyncio.run(run_rollouts(plan, proxy_factory(config, tasks=plan.tasks)))
        except LogprobsMismatch as exc:
            print(f"polar rollout: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            left = len(pending_episodes(plan))
            print(
                f"\ninterrupted: {len(plan.episodes()) - left} of {len(plan.episodes())} episodes are in "
                f"{plan.out}; run the same command again to do the other {left}",
                file=sys.stderr,
            )
            return 130
        summary = summarize(trajectories)
        watch.report(summary, step=len(trajectories))
    print(summary_table(trajectories))
    print(json.dumps(summary, indent=2))
    print(time_split(trajectories))
    if masked := masked_lines(trajectories):
        print(masked)
    return 0

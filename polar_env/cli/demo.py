"""`polar demo`: the whole pipeline on the embedded default, on one machine, in a few minutes.

Real harness (Pi by default) in a bubblewrap sandbox, through the proxy, against the embedded
SmolLM2-135M-Instruct in process, graded by the SWE-bench reward module on the bundled tasks;
then trajectories, NeMo-RL results, the GRPO batch and the viewer page, and a summary table that
says which model and which policy produced the turns.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import time
from pathlib import Path

from polar_env.backends.embedded import EMBEDDED_MODEL_NAME
from polar_env.cli.rollout import add_job_arguments, config_from_args
from polar_env.rollout.config import RolloutConfig

QUICK = {"limit": 2, "samples": 1, "timeout": 120.0, "concurrency": 2}
FULL = {"limit": None, "samples": 2, "timeout": 300.0, "concurrency": 2}
# Per-call token budget unless --max-tokens says otherwise. The embedded model's answers are cut short
# to keep a CPU demo quick; a scripted policy's answer is the script's (the gold patch is one long
# tool call, up to ~400 tokens on the bundled tasks), so it gets rollout's budget.
MODEL_MAX_TOKENS = {"quick": 96, "full": 160}
SCRIPTED_MAX_TOKENS = 1024


def default_max_tokens(policy: str, quick: bool) -> int:
    return MODEL_MAX_TOKENS["quick" if quick else "full"] if policy == "model" else SCRIPTED_MAX_TOKENS


def policy_label(config: RolloutConfig, model: str) -> str:
    if config.policy == "model":
        return (
            f"{model} sampled every turn itself (T={config.temperature}, top_p={config.top_p}); "
            "an untrained 135M model: expect reward 0, the point is the pipeline"
        )
    from polar_env.harness_adapters.policies import LABELS

    return f"{LABELS.get(config.policy, config.policy)}; logprobs from {model}"


def write_viewer(out: Path) -> Path | None:
    from polar_env.cli.view import write_view

    page = out / "viewer.html"
    return page if write_view(out / "trajectories.jsonl", page) else None


def polar_command() -> str:
    """How to run ``polar`` again from this shell: ``polar`` where that is this program on PATH, else
    the path it was started by (``.venv/bin/polar`` from scripts/demo.sh), or ``python -m``."""
    me = Path(sys.argv[0])
    if me.name != "polar":
        return f"{os.path.relpath(sys.executable)} -m polar_env.cli"
    on_path = shutil.which("polar")
    return "polar" if on_path is not None and Path(on_path).resolve() == me.resolve() else str(me)


def deadline_hint(config: RolloutConfig, trajectories: list) -> str:
    """Why a masked deadline can happen in a demo, with the numbers that caused it (empty otherwise)."""
    from polar_env.outcomes import FailureKind

    if not any(t.failure_kind is FailureKind.deadline_backend for t in trajectories):
        return ""
    return (
        f"deadline_backend: each episode had {config.timeout:g} s (--timeout) with the model answering at "
        f"most {config.max_tokens} tokens a call (--max-tokens), and the embedded model on this machine's "
        "CPU was slower than that allows (other jobs share the cores?). Such an episode is masked, not "
        "scored 0; run again with a larger --timeout to let it finish."
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_job_arguments(parser)
    parser.add_argument("--quick", action="store_true", help="2 tasks, 1 sample each (what CI runs)")
    parser.set_defaults(
        out=Path("runs/demo"), max_tokens=None, **dict.fromkeys(FULL)
    )  # None: the preset decides


def run(args: argparse.Namespace) -> int:
    from polar_env.harness_adapters.registry import get_adapter
    from polar_env.rollout.outputs import finish_outputs, masked_lines, summarize, summary_table, time_split
    from polar_env.rollout.plan import plan_from_config
    from polar_env.rollout.runner import prepare, proxy_factory, run_rollouts
    from polar_env.rollout.watch import Watch, WatchUnavailable

    preset = QUICK if args.quick else FULL  # explicit flags win over either preset
    if args.timeout is None:
        # the in-process model prefills each call's whole prompt on CPU: a long first prompt takes
        # minutes of a busy 2-core machine, with two episodes taking turns on the one model
        args.timeout = preset["timeout"] + get_adapter(args.harness).prefill_allowance_s
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.max_tokens is None:
        args.max_tokens = default_max_tokens(args.policy, args.quick)
    config = config_from_args(args)
    started = time.monotonic()
    plan = plan_from_config(config)
    print(
        f"polar demo: {len(plan.tasks)} bundled task(s) x {plan.samples} sample(s), harness "
        f"{config.harness}, run slots {plan.run_slots}, out {plan.out}",
        flush=True,
    )
    prepare(plan)
    try:
        watch = Watch(config, plan.out, "polar demo")
    except WatchUnavailable as exc:
        print(f"polar demo: {exc}", file=sys.stderr)
        return 2
    with watch:
        try:
            trajectories = asyncio.run(run_rollouts(plan, proxy_factory(config, tasks=plan.tasks)))
        except KeyboardInterrupt:
            print(
                f"\ninterrupted: the finished episodes are in {plan.out}; run the same command again to do "
                "the others",
                file=sys.stderr,
            )
            return 130
        summary = finish_outputs(plan.out, trajectories)
        watch.report(summary, step=len(trajectories))
    page = write_viewer(plan.out)
    model = ", ".join(summary["models"]) or EMBEDDED_MODEL_NAME
    print()
    print(summary_table(trajectories))
    print()
    s = summarize(trajectories)
    print(
        f"episodes {s['episodes']}  completed {s['status']['completed']}  timeout {s['status']['timeout']}  "
        f"error {s['status']['error']}  resolved {s['resolved']}/{s['episodes']} ({s['resolved_rate']:.0%})  "
        f"sampled {s['sampled_tokens']}  trainable {s['trainable_tokens']}  chains {s['chains']}  "
        f"time {time.monotonic() - started:.0f}s"
    )
    print(time_split(trajectories))
    for extra in (masked_lines(trajectories), deadline_hint(config, trajectories)):
        if extra:
            print(extra)
    print(f"model:  {model} via the {', '.join(s['backends'])} backend")
    print(f"policy: {policy_label(config, model)}")
    print(
        f"outputs: {plan.out}/trajectories.jsonl, nemo_results.jsonl, grpo_batch.jsonl, summary.json"
        + (f", {page}" if page else "")
    )
    print(f"check them: {polar_command()} check {plan.out}/nemo_results.jsonl --samples {plan.samples}")
    return 0

"""`polar train`: close the loop on one machine with the embedded model.

1. gold replays: the harness runs each task with the scripted gold policy (``polar demo --policy
   gold``), through the proxy, graded; the resolved episodes are the SFT data (``--gold DIR`` reuses
   a run's);
2. step 0: the untrained model samples every turn of K episodes per task itself (reward 0 expected);
3. SFT warm start with TRL's SFTTrainer on those episodes' token-exact rows (every chain,
   assistant-only loss);
4. GRPO steps with ``PolarGRPOTrainer`` (TRL's GRPOTrainer, the project's one GRPO implementation):
   K episodes per task through the real harness, sampled by the live model (the proxy's local
   backend wraps the very module being trained, so the rollouts are on-policy), graded by the
   SWE-bench tests, one update per step over the top layers (the trunk stays frozen, as in the
   warm start);
5. a last round of rollouts after the last update.

Writes OUT/metrics.jsonl (one line per rollout round and per update), OUT/reward.png (mean reward
per step), OUT/checkpoints/{sft,step-N} (Hugging Face model dirs) and the rollout outputs in
OUT/rounds/step-N (the untrained and the last round) and OUT/rounds/grpo (the GRPO steps' episodes). A CPU run
memorises a handful of tasks; it shows the loop closes, not that the model generalises (docs/learning.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from polar_env.cli.rollout import add_job_arguments, config_from_args
from polar_env.rollout.config import RolloutConfig
from polar_env.rollout.watch import Watch, WatchUnavailable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_job_arguments(parser)
    parser.add_argument(
        "--gold",
        type=Path,
        help="a run directory of gold replays to warm start from "
        "(default: replay the gold patches into OUT/gold first)",
    )
    parser.add_argument("--sft-epochs", type=int, default=20, help="passes over the resolved gold chains")
    parser.add_argument("--sft-lr", type=float, default=1e-3)
    parser.add_argument(
        "--grpo-steps",
        type=int,
        default=1,
        help="GRPO updates; each takes --samples (>= 2) episodes per task",
    )
    parser.add_argument("--lr", type=float, default=1e-5, help="GRPO learning rate (AdamW)")
    parser.add_argument(
        "--top-layers",
        type=int,
        default=2,
        help="decoder layers trained (the top ones; the rest stay frozen, a CPU budget)",
    )
    parser.add_argument(
        "--keep-checkpoints",
        type=int,
        default=2,
        help="keep the SFT checkpoint and the last N GRPO ones (each is the full model)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-logprob-drift",
        type=float,
        default=1e-3,
        metavar="D",
        help="stop when a GRPO step's trainer logprobs differ from the recorded (same-version) ones "
        'by more than D (docs/training.md, "The step-0 drift")',
    )
    parser.set_defaults(out=Path("runs/train"), samples=2, concurrency=2, max_tokens=320, timeout=600.0)


class Run:
    """The state of one `polar train` run: the live model, its metrics, its output folder."""

    def __init__(self, config: RolloutConfig, model_dir: Path, watch: Watch | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config
        self.watch = watch  # --report-to: every metrics.jsonl line, under its own keys
        self.step = 0
        self.model_dir = model_dir
        self.out = config.out
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.metrics: list[dict[str, Any]] = []
        self.started = time.monotonic()

    def rollouts(self, step: int, phase: str) -> list:
        """K episodes per task, every turn sampled by the live model, into OUT/rounds/step-N (no update)."""
        from polar_env.backends.local import LocalBackend
        from polar_env.rollout.plan import plan_from_config
        from polar_env.rollout.runner import proxy_factory, run_rollouts

        config = self.config.model_copy(
            update={"out": self.out / "rounds" / f"step-{step}", "policy": "model"}
        )
        # at a temperature other than 1 the recorded logprobs must be those of the distribution sampled from
        mode = "raw" if (config.temperature, config.top_p) == (1.0, 1.0) else "processed"
        backend = LocalBackend(self.model, self.tokenizer, model_name=self.model_name, logprobs_mode=mode)
        self.model.eval()
        trajectories = asyncio.run(
            run_rollouts(plan_from_config(config), proxy_factory(config, backend=backend))
        )
        self.record_round(step, phase, trajectories)
        return trajectories

    def record_round(self, step: int, phase: str, trajectories: list) -> None:
        from polar_env.trajectory.accepted import accepted_work

        rewards = [float(t.reward or 0.0) for t in trajectories]
        self.record(
            {
                "step": step,
                "phase": phase,
                "episodes": len(trajectories),
                "resolved": sum(bool(t.grading and t.grading.resolved) for t in trajectories),
                "mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
                "accepted_work": accepted_work(trajectories),
            }
        )

    @property
    def model_name(self) -> str:
        stamp = self.model_dir / "polar_embedded.json"
        return json.loads(stamp.read_text())["model"] if stamp.is_file() else self.model_dir.name

    def record(self, entry: dict[str, Any]) -> None:
        from polar_env.training.reward_plot import plot_rewards

        entry["wall_s"] = round(time.monotonic() - self.started, 1)
        with open(self.out / "metrics.jsonl", "a") as handle:
            handle.write(json.dumps(entry) + "\n")
        self.step = entry.get(
            "step", self.step
        )  # the SFT warm start is logged at the step before the first update
        if self.watch is not None:
            self.watch.report(entry, step=self.step)
        if "mean_reward" in entry:
            self.metrics.append(entry)
            plot_rewards(
                self.metrics,
                self.out / "reward.png",
                title=f"polar train: {self.model_name}, {self.config.harness}, "
                f"{len(self.config.task_ids or []) or 'all'} task(s) x {self.config.samples}",
            )

    def checkpoint(self, name: str, keep: int) -> Path:
        import shutil

        path = self.out / "checkpoints" / name
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        steps = sorted((p for p in path.parent.glob("step-*")), key=lambda p: int(p.name.split("-")[1]))
        for old in steps[:-keep] if keep else steps:
            shutil.rmtree(old)
        return path


def advantage_rows(trajectories: list) -> int:
    """Episodes in a group (same task) whose rewards differ: the only rows with a GRPO advantage."""
    groups: dict[str | None, list[float]] = {}
    for t in trajectories:
        groups.setdefault(t.task_id, []).append(float(t.reward or 0.0))
    return sum(len(r) for r in groups.values() if len(set(r)) > 1)


def grpo_steps(run_: Run, args: argparse.Namespace, tasks: int, stages: Any) -> None:
    """``args.grpo_steps`` GRPO steps of ``PolarGRPOTrainer`` over the top layers (the rest stay frozen):
    each step ``--samples`` episodes per task by the live model, one optimizer step over all of them."""
    from transformers import TrainerCallback
    from trl import GRPOConfig  # pyright: ignore[reportPrivateImportUsage]  # trl's lazy exports

    from polar_env.training.frozen_trunk import freeze_all_but_top
    from polar_env.training.grpo import PolarGRPOTrainer
    from polar_env.training.rollouts import PolarRollouts

    freeze_all_but_top(run_.model, args.top_layers)
    config = run_.config.model_copy(update={"out": run_.out / "rounds" / "grpo"})
    rollouts = PolarRollouts(run_.model, config, tokenizer=run_.tokenizer)
    samples = run_.config.samples
    grpo_args = GRPOConfig(
        output_dir=str(run_.out / "trl"),
        num_generations=samples,
        per_device_train_batch_size=samples,
        gradient_accumulation_steps=tasks,
        max_steps=args.grpo_steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        beta=0.0,
        temperature=run_.config.temperature,
        top_p=1.0,
        bf16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        disable_tqdm=True,
    )
    trainer = PolarGRPOTrainer(run_.model, rollouts, grpo_args, max_drift=args.max_logprob_drift)
    trainer.add_callback(rollouts.weight_sync())  # the fence around every optimizer step
    trained = [(name, p) for name, p in run_.model.named_parameters() if p.requires_grad]
    before = {name: p.detach().clone() for name, p in trained}
    update: dict[str, Any] = {}

    class Rounds(TrainerCallback):
        def on_step_begin(self, *a: Any, **kw: Any) -> None:
            stages.set_postfix_str(f"GRPO step {trainer.state.global_step + 1}: rollouts and update")

        def on_step_end(self, a: Any, state: Any, *rest: Any, **kw: Any) -> None:
            step = state.global_step
            trajectories = rollouts.last_trajectories
            run_.record_round(step, "after SFT" if step == 1 else f"GRPO {step - 1}", trajectories)
            changed = max(float((p.detach() - before[name]).abs().max()) for name, p in trained)
            for name, p in trained:
                before[name].copy_(p.detach())
            fidelity = trainer.polar_fidelity[-1] if trainer.polar_fidelity else {}
            fence = rollouts.fence.windows[-1].model_dump() if rollouts.fence.windows else None
            versions = [t.stats.policy_versions for t in trajectories]
            update.update(
                {
                    "step": step,
                    "phase": "grpo update",
                    "rows": advantage_rows(trajectories),
                    "episodes": len(trajectories),
                    "weights_max_change": changed,
                    "policy_versions": sorted({v for vs in versions for v in vs}),
                    "episodes_spanning_update": sum(len(vs) > 1 for vs in versions),
                    "episodes_started_ahead": len(rollouts.ahead),
                    "fence": fence,
                    **{k: v for k, v in fidelity.items() if k != "step"},
                }
            )
            run_.checkpoint(f"step-{step}", args.keep_checkpoints)
            stages.update()

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
            if logs and "loss" in logs and update:
                run_.record(
                    {**update, "loss": logs["loss"], "frac_reward_zero_std": logs.get("frac_reward_zero_std")}
                )
                update.clear()

    trainer.add_callback(Rounds())
    try:
        trainer.train()
    finally:
        rollouts.close()


def gold_replays(config: RolloutConfig, out: Path) -> Path:
    """Each task once with the scripted gold policy (resumable: a rerun skips the finished ones)."""
    from polar_env.rollout.plan import plan_from_config
    from polar_env.rollout.runner import prepare, proxy_factory, run_rollouts

    gold = config.model_copy(update={"out": out, "policy": "gold", "samples": 1, "max_tokens": 1024})
    plan = plan_from_config(gold)
    prepare(plan)
    asyncio.run(run_rollouts(plan, proxy_factory(gold, tasks=plan.tasks)))
    return out


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if config.policy != "model" or config.backend != "local":
        print(
            "polar train: trains the in-process model: --policy model --backend local only", file=sys.stderr
        )
        return 2
    if config.top_p != 1.0:
        print("polar train: the GRPO ratio is computed at top_p 1.0 only", file=sys.stderr)
        return 2
    if config.samples < 2:
        print(
            "polar train: GRPO needs --samples 2 or more (a group of one has no advantage)", file=sys.stderr
        )
        return 2
    config.out.mkdir(parents=True, exist_ok=True)
    try:
        watch = Watch(config, config.out, "polar train")  # /metrics from the gold replays on
    except WatchUnavailable as exc:
        print(f"polar train: {exc}", file=sys.stderr)
        return 2
    with watch:
        return _train(args, config, watch)


def _train(args: argparse.Namespace, config: RolloutConfig, watch: Watch) -> int:
    """The stages (module docstring), each round's and update's figures to metrics.jsonl and ``watch``."""
    import torch
    from tqdm import tqdm

    from polar_env.backends.embedded import embedded_model_dir
    from polar_env.rollout.plan import plan_from_config
    from polar_env.rollout.runner import prepare
    from polar_env.tasks.loader import TaskLoadError
    from polar_env.tasks.runtime import WorkspaceUnavailable
    from polar_env.training.grpo import LogprobDrift
    from polar_env.training.warm_start import sft_warm_start
    from polar_env.trajectory.export import read_trajectories, write_jsonl
    from polar_env.trajectory.sft import sft_rows

    torch.manual_seed(args.seed)
    try:
        plan = plan_from_config(config)
        prepare(plan)
    except (TaskLoadError, WorkspaceUnavailable) as exc:
        print(f"polar train: {exc}", file=sys.stderr)
        return 2
    gold_dir = args.gold or gold_replays(config, config.out / "gold")
    gold_file = gold_dir / "trajectories.jsonl"
    tasks = {t.instance_id for t in plan.tasks}
    rows = [
        r
        for r in (
            sft_rows(read_trajectories(gold_file), "trl-sft", only_resolved=True)
            if gold_file.is_file()
            else []
        )
        if r["task_id"] in tasks
    ]
    if not rows:
        print(f"polar train: no resolved gold episode in {gold_dir}", file=sys.stderr)
        return 2
    write_jsonl(config.out / "trl-sft.jsonl", rows)
    run_ = Run(config, config.model_dir or embedded_model_dir(), watch)
    stages = tqdm(total=args.grpo_steps + 3, desc="polar train", unit="stage", position=1)
    try:
        stages.set_postfix_str("step 0: the untrained model")
        run_.rollouts(0, "base")
        stages.update()
        stages.set_postfix_str(f"SFT on {len(rows)} gold chains")
        losses = sft_warm_start(
            run_.model,
            rows,
            epochs=args.sft_epochs,
            learning_rate=args.sft_lr,
            top_layers=args.top_layers,
            progress=lambda n, loss: stages.set_postfix_str(
                f"SFT step {n}/{args.sft_epochs * len(rows)} loss {loss:.3f}"
            ),
        )
        run_.record({"phase": "sft", "chains": len(rows), "first_loss": losses[0], "last_loss": losses[-1]})
        run_.checkpoint("sft", args.keep_checkpoints)
        stages.update()
        try:
            grpo_steps(run_, args, len(plan.tasks), stages)
        except LogprobDrift as exc:
            run_.record({"phase": "stopped: logprob drift", "error": str(exc)})
            print(f"polar train: {exc}", file=sys.stderr)
            return 3
        stages.set_postfix_str("rollouts after the last update")
        run_.rollouts(args.grpo_steps + 1, f"GRPO {args.grpo_steps}")
        stages.update()
    finally:
        stages.close()
    first, last = run_.metrics[0], run_.metrics[-1]
    print(
        f"mean reward {first['mean_reward']:.2f} (untrained) -> {last['mean_reward']:.2f} after SFT + "
        f"{args.grpo_steps} GRPO step(s); {time.monotonic() - run_.started:.0f}s"
    )
    print(f"outputs: {config.out}/metrics.jsonl, {config.out}/reward.png, {config.out}/checkpoints/")
    return 0

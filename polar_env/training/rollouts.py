"""Polar as TRL's rollout source: each rollout of a GRPO step is one real harness episode.

TRL's ``GRPOTrainer(rollout_func=...)`` hands the function the prompts of a step (each already
repeated ``num_generations`` times) and the trainer, and takes back ``prompt_ids``,
``completion_ids`` and ``logprobs`` per prompt, plus extra fields: ``env_mask`` (1 on tokens the
model sampled, 0 on tool output and template glue) and anything the reward functions read. Here a
prompt is the first user message of a task (``episodes.episode_prompt``); the episode runs through
the usual staged driver (``rollout.runner.EpisodeRunner``: sandbox, harness, proxy, grading, each
stage within the plan's limits: ``run_slots`` / ``concurrency`` model calls at once), and the
row TRL gets is the trajectory's main chain exactly as the proxy captured it — prompt ids up to the
first sampled token, then the rest of the chain, with Polar's loss mask and recorded logprobs.

On one machine the proxy's backend is a ``LocalBackend`` over the trainer's own model object (not a
copy): every episode of step N samples from the weights step N trains, so the rollouts are on-policy
and nothing has to be synced. With ``RolloutConfig.max_staleness`` >= 1 the next step's episodes
start as soon as a step's rollouts are handed over, and sample during its update: ``weight_sync()``
closes the proxy's fence around each optimizer step, and each call records the version (updates
done) that sampled it, so one episode can span two versions (docs/training.md). It records ``processed``
logprobs (the distribution after the trainer's temperature), which is what TRL's forward pass computes when
top-p is 1. A scripted policy (``RolloutConfig.policy``) picks the text instead and the same live model scores
it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from polar_env.backends.local import LocalBackend
from polar_env.episodes import episode_prompt
from polar_env.proxy.policy import PauseRequest, PolicyFence
from polar_env.rollout.config import RolloutConfig
from polar_env.rollout.outputs import RolloutOutputs, finish_outputs
from polar_env.rollout.plan import RolloutPlan, plan_from_config
from polar_env.rollout.runner import EpisodeRunner, prepare, proxy_factory
from polar_env.tasks.models import Task
from polar_env.trajectory.export import read_trajectories
from polar_env.trajectory.models import Trajectory
from polar_env.trajectory.paths import Selector, one_chain, policy_versions, selector

Policy = Callable[[str | None, int, str], str]


def trl_row(traj: Trajectory, eos_token_id: int, train_paths: str | Selector = "all") -> dict[str, Any]:
    """One TRL rollout row from a trajectory's chain, ids and logprobs as recorded.

    TRL trains one completion per rollout: the row is the chain ``paths.one_chain`` picks from the
    ones ``train_paths`` selects (the main chain when selected); the other selected chains' tokens
    are counted in ``side_tokens``. A trajectory with nothing trainable (no selected chain, or
    masked by the outcome table) still gives a row, all of it masked, so its reward stays in the
    group's baseline (NeMo-RL's ``mask_sample``): one failed sample never costs its group.
    """
    chain, side = one_chain(traj, train_paths)
    if chain is None:  # masked (or nothing selected): the main chain's ids, without loss
        chain = traj.chains[traj.main_chain] if traj.main_chain is not None else None
        if chain is None:
            first = next((ch.first_prompt_ids() for ch in traj.chains), None) or [eos_token_id]
            return {
                "prompt_ids": first,
                "completion_ids": [eos_token_id],
                "logprobs": [0.0],
                "env_mask": [0],
                "side_tokens": 0,
                "policy_versions": [],
            }
        start = len(chain.first_prompt_ids())
        mask = [0] * (len(chain.input_ids) - start)
    else:
        start = len(chain.first_prompt_ids())
        mask = chain.loss_mask[start:]
    return {
        "prompt_ids": chain.input_ids[:start],
        "completion_ids": chain.input_ids[start:],
        "logprobs": chain.logprobs[start:],
        "env_mask": mask,
        "side_tokens": side,
        "policy_versions": policy_versions(traj, chain),
    }


class PolarRollouts:
    """A TRL ``rollout_func`` running harness episodes with ``model`` (the trainer's model object).

    ``config`` says which harness, tasks, sandbox, token budget per call, deadline, concurrency and
    output directory (``config.out`` collects every episode's trajectory, as ``polar rollout``
    writes them); temperature and top-p come from the trainer at each step. ``policy``, when
    given, overrides ``config.policy`` with a scripted policy callable.
    """

    def __init__(
        self, model: Any, config: RolloutConfig, *, policy: Policy | None = None, tokenizer: Any = None
    ):
        from transformers import AutoTokenizer

        from polar_env.backends.embedded import embedded_model_dir

        self.config = config
        self.train_paths = selector(config.train_paths)  # a bad --train-paths fails here, before any episode
        self.side_tokens = 0  # trainable tokens of selected chains TRL's one row per rollout left out
        self.plan: RolloutPlan = plan_from_config(config)
        model_dir = config.model_dir or embedded_model_dir()
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(model_dir))
        device = str(next(model.parameters()).device)
        self.model = LocalBackend(
            model,
            tokenizer,
            name="trl-live",
            model_name=config.model_name,
            device=device,
            logprobs_mode="processed",
        )
        backend: Any = self.model
        if policy is None and config.policy != "model":
            from polar_env.harness_adapters.policies import make_policy

            policy = make_policy(config.policy, self.plan.tasks)
        if policy is not None:
            from polar_env.backends.scripted import ScriptedBackend

            backend = ScriptedBackend(self.model, policy, context_window=config.score_window)
        self.eos_token_id = self.model.eos_token_ids[0]
        self.tasks: dict[str, Task] = {episode_prompt(t): t for t in self.plan.tasks}
        self._samples: Counter[str] = Counter()
        self._ahead: list[tuple[Task, Future]] = []  # episodes started for the next step (max_staleness)
        prepare(self.plan)
        self._runner = EpisodeRunner(
            self.plan, proxy_factory(config, backend=backend, tasks=self.plan.tasks), self.plan.out / "ledger"
        )
        self._outputs = RolloutOutputs(self.plan.out)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="polar-rollouts", daemon=True)
        self._thread.start()
        self._submit(self._runner.start())

    def dataset(self) -> Any:
        """The training set TRL samples prompts from: one row per task, the prompt its harness gets."""
        from datasets import Dataset

        return Dataset.from_list(
            [{"prompt": prompt, "task_id": task.instance_id} for prompt, task in self.tasks.items()]
        )

    @property
    def ahead(self) -> list[Task]:
        """The tasks of the episodes started for the next step (running, or done and waiting)."""
        return [task for task, _ in self._ahead]

    @property
    def fence(self) -> PolicyFence:
        """The proxy's policy version and weight-sync fence (proxy/policy.py)."""
        return self._runner.live_proxy.engine.fence

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        module = trainer.accelerator.unwrap_model(trainer.model)
        if module is not self.model.module:
            raise ValueError(
                "PolarRollouts must sample with the trainer's own model object (pass the same "
                "model to PolarRollouts and the trainer), or the rollouts are off-policy"
            )
        unknown = [p for p in prompts if p not in self.tasks]
        if unknown:
            raise ValueError(
                f"{len(unknown)} prompt(s) are not first prompts of this run's tasks "
                "(use PolarRollouts.dataset() as the training set)"
            )
        sampling = {"temperature": float(trainer.temperature), "top_p": float(trainer.top_p)}  # the trainer's
        self._runner.plan = replace(self._runner.plan, episode=self.plan.episode.model_copy(update=sampling))
        self._loop.call_soon_threadsafe(
            self.fence.set_version, trainer.state.global_step
        )  # the updates so far
        jobs = []
        for prompt in prompts:  # an episode started ahead for this task (during the last update) first
            task = self.tasks[prompt]
            ahead = next((i for i, (t, _) in enumerate(self._ahead) if t is task), None)
            jobs.append(self._ahead.pop(ahead)[1] if ahead is not None else self._start(task))
        training = module.training
        module.eval()  # sample without dropout; the trainer's own forward passes set their mode
        try:
            trajectories = [job.result() for job in jobs]
        finally:
            module.train(training)
        if self.plan.max_staleness:  # the next step's episodes start now and sample across this step's update
            self._ahead += [(self.tasks[p], self._start(self.tasks[p])) for p in prompts]
        rows = [trl_row(t, self.eos_token_id, self.train_paths) for t in trajectories]
        out: dict[str, list[Any]] = {
            key: [r[key] for r in rows] for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask")
        }
        out["polar_policy_versions"] = [r["policy_versions"] for r in rows]
        self.side_tokens += sum(r["side_tokens"] for r in rows)
        out["polar_reward"] = [t.reward for t in trajectories]
        out["polar_session"] = [t.session_id for t in trajectories]
        self.last_trajectories = trajectories
        return out

    def _start(self, task: Task) -> Future:
        """One episode of ``task`` started on the rollouts' loop (its next sample number)."""
        sample = self._samples[task.instance_id]
        self._samples[task.instance_id] += 1
        return asyncio.run_coroutine_threadsafe(self._episode(task, sample), self._loop)

    async def _episode(self, task: Task, sample: int) -> Trajectory:
        trajectory = await self._runner.run(task, sample)  # within the plan's stage limits
        await self._runner.grading.off_loop(self._outputs.add, trajectory)
        return trajectory

    def weight_sync(self) -> Any:
        """A ``TrainerCallback`` closing the proxy's fence around each optimizer step: episodes in
        flight (started ahead, ``max_staleness``) finish their generation and wait, the weights
        change, and their next calls are sampled by the new version."""
        from transformers import TrainerCallback

        rollouts = self

        class WeightSync(TrainerCallback):
            def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                rollouts._submit(rollouts.fence.pause(PauseRequest(in_flight="finish", timeout_s=3600)))

            def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                rollouts._loop.call_soon_threadsafe(rollouts.fence.resume, state.global_step + 1)

        return WeightSync()

    def _submit(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        """Stop the proxy and the loop (episodes started ahead finish first, recorded, never thrown
        away); write the run's GRPO batch and summary next to its trajectories."""
        if not self._thread.is_alive():
            return
        for _task, job in self._ahead:
            job.exception()  # waits; an episode's own failure is in its trajectory
        self._ahead = []
        try:
            self._submit(self._runner.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._outputs.close()
        path = self.plan.out / "trajectories.jsonl"
        if path.exists():
            finish_outputs(self.plan.out, list(read_trajectories(path)), self.config.train_paths)

    def __enter__(self) -> PolarRollouts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

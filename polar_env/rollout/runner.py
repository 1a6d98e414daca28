"""Episodes of a plan on this host, stage by stage, all through one proxy on a Unix socket."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from polar_env import metrics
from polar_env.backends.logprobs_mode import LogprobsMismatch, sampling_mismatch
from polar_env.environment import EnvSettings
from polar_env.episodes import stages
from polar_env.episodes.episode import Episode, EpisodeResult
from polar_env.episodes.grading import Grading
from polar_env.proxy.app import ProxyServer
from polar_env.proxy.policy import Admission
from polar_env.proxy.run_slots import RunSlots
from polar_env.proxy.settings import admin_secret, build_proxy, proxy_model
from polar_env.rollout.config import RolloutConfig
from polar_env.rollout.outputs import RolloutOutputs, finish_outputs
from polar_env.rollout.plan import RolloutPlan, attempt_session_id, episode_key, pending_episodes
from polar_env.rollout.progress import Progress
from polar_env.tasks.models import Task
from polar_env.trajectory.accepted import Sample, accepted_work
from polar_env.trajectory.export import read_trajectories
from polar_env.trajectory.models import Trajectory

ProxyFactory = Callable[[Path, Path], ProxyServer]  # (ledger dir, Unix socket) -> an unstarted proxy
STAGES = (
    "prepare",
    "wait",
    "run",
    "finish",
)  # what the progress bar counts (wait: prepared, no run slot yet)


class EpisodeRunner:
    """Episodes of a plan on this host, all through one proxy on a Unix socket (the sandboxes'
    only way out), each stage within its own limit (``RolloutPlan``, docs/rollout.md "Stages"):
    ``run_slots + lookahead`` episodes between the start of their prepare and the end of their run
    (live harnesses), ``prepare_slots`` of them preparing (up to their harness's first model call),
    ``run_slots`` model calls at once (the proxy's per-call admission: a harness in a tool leaves
    its slot to another's call),
    ``grade_slots`` grading. Collapsed: ``run_slots`` episodes at a time over all stages. ``polar
    rollout``, ``polar demo`` and ``polar train`` run one; under Ray every node runs its own."""

    def __init__(
        self,
        plan: RolloutPlan,
        proxy_factory: ProxyFactory,
        ledger: Path,
        *,
        metadata: dict[str, Any] | None = None,
    ):
        self.plan = plan
        self.proxy_factory = proxy_factory
        self.ledger = ledger
        # stamped on every trajectory (e.g. the Ray node); the run slots and GPUs: its accepted work's
        # denominators
        self.metadata = {
            "run_slots": plan.run_slots,
            **({"gpus": plan.gpus} if plan.gpus else {}),
            **(metadata or {}),
        }
        self.proxy: ProxyServer | None = None
        self.admission: Admission | None = None  # --max-staleness: episodes start within K versions
        self.stages: Counter[str] = Counter()  # episodes in each stage now
        self.on_stage: Callable[[], None] | None = None  # told when an episode changes stage
        self._sock_dir: Path | None = None
        prepare_slots, lookahead, grade_slots = plan.limits()
        self.grading = Grading(grade_slots, processes=plan.grade_in_processes)
        self._limits = (plan.run_slots,) if plan.collapsed else (plan.run_slots + lookahead, prepare_slots)
        self._semaphores: list[asyncio.Semaphore] = []  # made on the loop that uses them (start)

    async def start(self) -> None:
        self._sock_dir = Path(tempfile.mkdtemp(prefix="polar-sock-"))  # AF_UNIX paths are <108 bytes
        self._sock_dir.chmod(0o755)
        socket = self._sock_dir / "proxy.sock"
        self.proxy = self.proxy_factory(self.ledger, socket)
        host, port = self.plan.admin.rpartition(":")[::2] if self.plan.admin else ("127.0.0.1", None)
        await self.proxy.start(host, int(port) if port else None, unix_socket=socket)
        if self.plan.admin:
            secret = self.proxy.admin_secret
            shown = "$POLAR_ADMIN_SECRET" if secret == EnvSettings.read().admin_secret else secret
            print(
                f"polar: admin API on http://{self.plan.admin}/admin (pause, resume, policy: "
                "docs/training.md), "
                f'-H "Authorization: Bearer {shown}"',
                flush=True,
            )
        if why := sampling_mismatch(self.proxy.logprobs_mode, self.plan.episode.sampling):
            raise LogprobsMismatch(why)  # every episode would be refused: say it once, before any runs
        if self.plan.max_staleness is not None:  # one training step = one pass over the plan's episodes
            self.admission = Admission(
                self.proxy.engine.fence, self.plan.max_staleness, len(self.plan.tasks) * self.plan.samples
            )
        if not self.plan.collapsed:
            self.proxy.engine.run_slots = RunSlots(self.plan.run_slots)
        metrics.BUSY.start(self.plan.run_slots)
        self._semaphores = [asyncio.Semaphore(n) for n in self._limits]

    @property
    def live_proxy(self) -> ProxyServer:
        """The proxy `start` made."""
        if self.proxy is None:
            raise RuntimeError("EpisodeRunner.start() first")
        return self.proxy

    async def run(self, task: Task, sample: int) -> Trajectory:
        """One episode through its stages; its trajectory (exported by the caller)."""
        assert self.proxy is not None, "start() first"
        queued = time.time()
        key = episode_key(task.instance_id, sample)
        if self.plan.collapsed:
            async with self._semaphores[0]:
                result = await self._stages(task, sample, key, queued)
        else:
            result = await self._stages(task, sample, key, queued)
        result.trajectory.metadata.update({"episode_key": key, **self.metadata})
        return result.trajectory

    async def _stages(self, task: Task, sample: int, key: str, queued: float) -> EpisodeResult:
        staged = not self.plan.collapsed
        ep: Episode | None = None
        try:
            async with _Held(
                self._semaphores[0] if staged else None
            ):  # live harnesses: released when the run ends
                admitted = (
                    {} if self.admission is None else {"admitted_at_version": await self.admission.admit()}
                )
                with self._stage("prepare"):
                    async with _Held(self._semaphores[1] if staged else None):
                        ep = stages.begin(
                            self.live_proxy,
                            task,
                            episode_id=attempt_session_id(key, self.ledger),
                            group_id=task.instance_id,
                            config=self.plan.episode,
                            queued_at=queued,
                            metadata={"episode_key": key, "sample": sample, **admitted, **self.metadata},
                        )
                        await stages.prepare(ep)
                        # its slot is held through the harness's boot too: a dozen harnesses booting at
                        # once on a few cores would each take several times as long to make a first call
                        await stages.booted(ep)
                with self._stage("wait"):
                    await stages.admitted(ep)
                with self._stage("run"):
                    await stages.run(ep)
            with self._stage("finish"):
                return await stages.finish(ep, self.grading)
        except BaseException:  # Ctrl-C (a cancel) or a bug: nothing of the episode is left; a rerun runs it
            if ep is not None:
                await stages.abort(ep)
            raise

    @contextmanager
    def _stage(self, name: str) -> Iterator[None]:
        self.stages[name] += 1
        self._changed()
        try:
            with metrics.stage(name):
                yield
        finally:
            self.stages[name] -= 1
            self._changed()

    def _changed(self) -> None:
        if self.on_stage is not None:
            self.on_stage()

    async def stop(self) -> None:
        self.grading.close()
        if self.proxy is not None:
            await self.proxy.stop()
        if self._sock_dir is not None:
            shutil.rmtree(self._sock_dir, ignore_errors=True)


class _Held:
    """``async with`` a semaphore, or with nothing."""

    def __init__(self, semaphore: asyncio.Semaphore | None):
        self.semaphore = semaphore

    async def __aenter__(self) -> None:
        if self.semaphore is not None:
            await self.semaphore.acquire()

    async def __aexit__(self, *exc: object) -> None:
        if self.semaphore is not None:
            self.semaphore.release()


async def run_rollouts(plan: RolloutPlan, proxy_factory: ProxyFactory) -> list[Trajectory]:
    """Run every unfinished episode of ``plan``; ``proxy_factory(data_dir, socket)`` builds the proxy."""
    outputs = RolloutOutputs(plan.out)
    todo = pending_episodes(plan)
    progress = Progress(len(plan.episodes()), len(plan.episodes()) - len(todo))
    runner = EpisodeRunner(plan, proxy_factory, plan.out / "ledger")
    progress.stages = runner.stages
    runner.on_stage = progress.update
    finished: list[Sample] = []
    metrics.publish_figures("run", lambda: accepted_work(finished))

    async def one(task: Task, sample: int) -> None:
        trajectory = await runner.run(task, sample)
        await runner.grading.off_loop(outputs.add, trajectory)  # JSON of a long episode: not on the loop
        finished.append(Sample.of(trajectory))
        progress.update(trajectory)

    try:
        if todo:
            await runner.start()
            # one episode's unexpected failure must not stop the others: it is reported, left out of
            # the outputs, and retried by a rerun on the same --out
            results = await asyncio.gather(*(one(t, k) for t, k in todo), return_exceptions=True)
            for (task, sample), result in zip(todo, results, strict=True):
                if isinstance(result, BaseException):
                    print(
                        f"episode {episode_key(task.instance_id, sample)} failed outside its sandbox: "
                        f"{type(result).__name__}: {result}",
                        file=sys.stderr,
                    )
    finally:
        progress.close()
        await runner.stop()
        outputs.close()
    trajectories = list(read_trajectories(plan.out / "trajectories.jsonl"))
    finish_outputs(plan.out, trajectories, plan.train_paths)
    return trajectories


def proxy_factory(config: RolloutConfig, backend=None, tasks: list[Task] | None = None) -> ProxyFactory:
    """A factory building the proxy for this run (one model load, reused across reruns); a scripted
    ``config.policy`` answers through a scripted backend over the local model."""
    if backend is None and config.policy != "model":
        from polar_env.backends.embedded import embedded_model_dir
        from polar_env.backends.registry import make_backend
        from polar_env.harness_adapters.policies import make_policy

        backend = make_backend(
            "scripted",
            model_dir=config.model_dir or embedded_model_dir(),
            policy=make_policy(config.policy, tasks or []),
            context_window=config.score_window,
        )
    model = proxy_model(config, backend)
    secret = admin_secret(config)

    def factory(data_dir: Path, socket: Path) -> ProxyServer:
        return build_proxy(
            config, data_dir=data_dir, admin_secret=secret, model=model, default_max_tokens=config.max_tokens
        )

    return factory


def prepare(plan: RolloutPlan) -> None:
    """Host-side setup and checks before the clock starts: each task's workspace can be made here
    (engine, image), the harness is installed, and each bubblewrap task's test env is built."""
    from polar_env.episodes.workspace import check_engine, workspace_kinds
    from polar_env.harness_adapters.registry import get_adapter
    from polar_env.tasks.env import ensure_task_env
    from polar_env.tasks.runtime import check_image

    kinds = workspace_kinds(plan.tasks, plan.episode.sandbox)
    for kind in set(kinds.values()):
        check_engine(kind)
    for task in plan.tasks:
        check_image(task, kinds[task.instance_id])
    get_adapter(plan.episode.harness).install()
    if plan.episode.grade:
        for task in plan.tasks:
            if kinds[task.instance_id] == "bubblewrap":
                ensure_task_env(task)

"""`polar rollout --ray`: the same job spread over a Ray cluster, each node with its own proxy and sandboxes.

One actor per alive node that offers CPUs, pinned there: it installs the harness and the task
environments on its node, loads the backend, starts a proxy on a node-local Unix socket and runs the
episodes the driver hands it through the same staged driver as ``polar rollout`` (rollout/runner.py:
``--run-slots`` sampling, ``--lookahead`` prepared ahead, ``--grade-slots`` grading, per node), fed
up to the sum of those at a time. The driver feeds every node from one
queue (a slow node simply takes fewer episodes), appends each trajectory to ``--out`` as it arrives,
and draws the progress bar; ``--out`` therefore lives on the driver only. Each node keeps its proxy
ledger under ``OUT/ledger/nodes/<node>`` when it can write there (this machine, or a shared
filesystem), else in its temp directory. Resuming works as without Ray: finished episodes are read
from ``--out``. Every node needs polar_env installed, bubblewrap, and npm access for the harness.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import sys
import tempfile
from collections import deque
from pathlib import Path
from typing import Any

from polar_env.rollout.config import RolloutConfig
from polar_env.rollout.outputs import RolloutOutputs, finish_outputs
from polar_env.rollout.plan import RolloutPlan, episode_key, pending_episodes
from polar_env.rollout.progress import Progress
from polar_env.rollout.runner import EpisodeRunner, prepare, proxy_factory
from polar_env.trajectory.export import read_trajectories
from polar_env.trajectory.models import Trajectory, TrajectoryMetadata


def node_ledger(out: Path, node_id: str) -> Path:
    """Where a node's proxy writes its ledger: beside ``--out`` when it can, else its temp dir."""
    for root in (out / "ledger" / "nodes", Path(tempfile.gettempdir()) / "polar-ledgers" / out.name):
        try:
            path = root / node_id[:12]
            path.mkdir(parents=True, exist_ok=True)
            return path
        except OSError:
            continue
    raise OSError(f"node {node_id}: no writable place for the ledger")


class NodeWorker:
    """A Ray actor on one node: its proxy, its sandboxes, its share of the episodes."""

    def __init__(self, plan: RolloutPlan, config: RolloutConfig):
        self.plan = plan
        self.config = config
        self.tasks = {t.instance_id: t for t in plan.tasks}
        self.runner: EpisodeRunner | None = None

    async def setup(self) -> dict[str, str]:
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        await asyncio.to_thread(prepare, self.plan)
        factory = await asyncio.to_thread(proxy_factory, self.config, tasks=self.plan.tasks)
        ledger = node_ledger(self.plan.out, node_id)
        self.runner = EpisodeRunner(
            self.plan,
            factory,
            ledger,
            metadata=TrajectoryMetadata(ray_node_id=node_id, host=socket.gethostname()),
        )
        await self.runner.start()
        return {"node_id": node_id, "host": socket.gethostname(), "ledger": str(ledger)}

    async def run(self, task_id: str, sample: int) -> str:
        """The finished episode's trajectory as JSON (what travels back to the driver)."""
        assert self.runner is not None, "setup() first"
        return (await self.runner.run(self.tasks[task_id], sample)).model_dump_json()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.stop()


def worker_nodes() -> list[dict[str, Any]]:
    """Alive nodes that offer CPUs (a head started with ``--num-cpus=0`` is meant to do no work)."""
    import ray

    return [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]


def run_on_ray(plan: RolloutPlan, config: RolloutConfig) -> list[Trajectory]:
    """Run the plan's unfinished episodes on the Ray cluster at ``config.ray`` ('auto': the local one)."""
    import ray

    plan = dataclasses.replace(plan, out=plan.out.resolve())  # nodes see the path, not the driver's cwd
    ray.init(address=config.ray, log_to_driver=False)
    try:
        return _drive(plan, config)
    finally:
        ray.shutdown()


def _drive(plan: RolloutPlan, config: RolloutConfig) -> list[Trajectory]:
    import ray
    from ray.exceptions import RayActorError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    todo = pending_episodes(plan)
    actors: list[Any] = []
    _, lookahead, grade_slots = plan.limits()
    per_node = plan.run_slots + (
        0 if plan.collapsed else lookahead + grade_slots
    )  # each node's pipeline full
    if todo:
        # num_cpus=0: the episodes run in sandboxes outside Ray's accounting; the stage limits bound them
        remote: Any = ray.remote(NodeWorker)  # an actor class: `.options(...).remote(...)` makes one
        candidates = [
            remote.options(
                num_cpus=0,
                max_concurrency=per_node + 2,
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
            ).remote(plan, config)
            for n in worker_nodes()
        ]
        for actor, ref in [(a, a.setup.remote()) for a in candidates]:
            try:
                info: dict[str, Any] = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - a node that cannot set up is left out
                print(f"ray: leaving a node out, its setup failed: {exc}", file=sys.stderr)
                ray.kill(actor)
                continue
            print(
                f"ray: node {info['node_id'][:12]} on {info['host']} ready (ledger {info['ledger']})",
                file=sys.stderr,
            )
            actors.append(actor)
        if not actors:
            raise RuntimeError("no Ray node could set up (see the messages above)")
    outputs = RolloutOutputs(plan.out)
    progress = Progress(len(plan.episodes()), len(plan.episodes()) - len(todo))
    queue = deque(todo)
    load = {actor: 0 for actor in actors}
    inflight: dict[Any, tuple[Any, Any, int]] = {}
    try:
        while queue or inflight:
            while queue and (free := [a for a in load if load[a] < per_node]):
                for actor in free[: len(queue)]:  # one per node at a time: every node gets work
                    task, sample = queue.popleft()
                    inflight[actor.run.remote(task.instance_id, sample)] = (actor, task, sample)
                    load[actor] += 1
            progress.running = len(inflight)
            progress.update()
            ready, _ = ray.wait(list(inflight), num_returns=1)
            actor, task, sample = inflight.pop(ready[0])
            if actor in load:
                load[actor] -= 1
            try:
                trajectory = Trajectory.model_validate_json(ray.get(ready[0]))
            except RayActorError as exc:  # the node or its worker died: its episodes go elsewhere
                queue.appendleft((task, sample))
                if load.pop(actor, None) is not None:
                    print(f"ray: a node's worker died, moving its episodes: {exc}", file=sys.stderr)
                if not load:
                    raise RuntimeError("every Ray node's worker died") from exc
                continue
            except Exception as exc:  # noqa: BLE001 - not written, so a rerun retries the episode
                progress.failed += 1
                print(f"ray: episode {episode_key(task.instance_id, sample)} failed: {exc}", file=sys.stderr)
                continue
            outputs.add(trajectory)
            progress.update(trajectory)
        if load:
            ray.get([actor.stop.remote() for actor in load], timeout=60)
    finally:
        progress.close()
        outputs.close()
        for actor in actors:
            ray.kill(actor)  # its sandboxes die with it (bubblewrap --die-with-parent)
    trajectories = list(read_trajectories(plan.out / "trajectories.jsonl"))
    finish_outputs(plan.out, trajectories, plan.train_paths)
    return trajectories

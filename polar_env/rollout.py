"""`polar rollout`: K rollouts per task (GRPO groups), N at a time, resumable, on disk as they end.

Layout of ``--out``:
  ledger/               the proxy's write-ahead log (every model call of every episode;
                        with --ray, ledger/nodes/<node>/ per node, see rollout_ray)
  trajectories.jsonl    Polar trajectories, one per finished episode, appended as each ends
  nemo_results.jsonl    the same episodes as NeMo-RL ``/run`` results (rebuilt at the end)
  grpo_batch.jsonl      per-chain rows with group-normalised advantages (rewritten at the end)
  summary.json          counts, resolved rate, tokens, time
A rerun on the same ``--out`` skips every episode already in trajectories.jsonl; an episode cut off
by an interrupt runs again as a new attempt (session ``<task>.s<k>.a<n+1>``), its partial ledger kept.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from polar_env.episodes import EpisodeConfig, run_episode
from polar_env.episodes.workspace import SANDBOX_CHOICES, WorkspaceUnavailable
from polar_env.outcomes import FailureKind, Outcome, OutcomeTable, parse_outcome
from polar_env.tasks.loader import TaskLoadError
from polar_env.tasks.models import Task
from polar_env.trajectory.export import (
    TrajectoryWriter,
    grpo_rows,
    read_trajectories,
    to_nemo_gym_result,
    write_jsonl,
)
from polar_env.trajectory.models import Trajectory


@dataclass
class RolloutPlan:
    tasks: list[Task]
    samples: int = 1
    concurrency: int = 1
    out: Path = Path("runs/rollout")
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)

    def episodes(self) -> list[tuple[Task, int]]:
        return [(task, k) for task in self.tasks for k in range(self.samples)]


def episode_key(task_id: str, sample: int) -> str:
    return f"{task_id}.s{sample}"


def finished_keys(out: Path) -> set[str]:
    path = out / "trajectories.jsonl"
    if not path.exists():
        return set()
    return {t.metadata.get("episode_key", "") for t in read_trajectories(path)}


def _session_id(key: str, ledger: Path) -> str:
    """A fresh session id per attempt, so an interrupted attempt's ledger stays as it was."""
    attempt = 0
    while (ledger / "sessions" / f"{key}.a{attempt}").exists():
        attempt += 1
    return f"{key}.a{attempt}"


class Progress:
    """The progress bar: done, running, failed, resolved so far, sampled tokens/s."""

    def __init__(self, total: int, done: int):
        self.bar = tqdm(total=total, initial=done, desc="rollouts", unit="ep", dynamic_ncols=True)
        self.running = self.failed = self.resolved = self.tokens = 0
        self.started = time.monotonic()

    def update(self, trajectory: Trajectory | None = None) -> None:
        """Refresh the bar; with a finished episode's trajectory, count it first."""
        if trajectory is not None:
            self.failed += trajectory.status != "completed"
            self.resolved += bool(trajectory.grading and trajectory.grading.get("resolved"))
            self.tokens += trajectory.stats.sampled_tokens
            self.bar.update(1)
        rate = self.tokens / max(time.monotonic() - self.started, 1e-9)
        self.bar.set_postfix(running=self.running, failed=self.failed, resolved=self.resolved,
                             tok_s=f"{rate:.1f}")

    def close(self) -> None:
        self.bar.close()


def pending_episodes(plan: RolloutPlan) -> list[tuple[Task, int]]:
    """The plan's episodes not yet in ``plan.out`` (what a rerun still has to do)."""
    done = finished_keys(plan.out)
    return [(t, k) for t, k in plan.episodes() if episode_key(t.instance_id, k) not in done]


def _drop_partial_line(path: Path) -> None:
    """A kill during a write leaves an unterminated last line; the next append would glue onto it."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)


class RolloutOutputs:
    """``--out`` as episodes end: a line in trajectories.jsonl and nemo_results.jsonl per episode,
    flushed at once, so an interrupt loses only the episodes still running."""

    def __init__(self, out: Path):
        out.mkdir(parents=True, exist_ok=True)
        for name in ("trajectories.jsonl", "nemo_results.jsonl"):
            _drop_partial_line(out / name)
        self._trajectories = TrajectoryWriter(out / "trajectories.jsonl")
        self._nemo = open(out / "nemo_results.jsonl", "a")  # noqa: SIM115 - appended as episodes end

    def add(self, trajectory: Trajectory) -> None:
        self._trajectories.write(trajectory)
        self._nemo.write(json.dumps(to_nemo_gym_result(trajectory)) + "\n")  # masked ones too: never dropped
        self._nemo.flush()

    def close(self) -> None:
        self._trajectories.close()
        self._nemo.close()

    def __enter__(self) -> RolloutOutputs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EpisodeRunner:
    """Episodes of a plan on this host, all through one proxy on a Unix socket (the sandboxes'
    only way out). ``polar rollout`` runs one; under Ray every node runs its own."""

    def __init__(self, plan: RolloutPlan, proxy_factory, ledger: Path, *,
                 metadata: dict[str, Any] | None = None):
        self.plan = plan
        self.proxy_factory = proxy_factory
        self.ledger = ledger
        self.metadata = metadata or {}  # stamped on every trajectory (e.g. the Ray node)
        self.proxy = None
        self._sock_dir: Path | None = None

    async def start(self) -> None:
        self._sock_dir = Path(tempfile.mkdtemp(prefix="polar-sock-"))  # AF_UNIX paths are <108 bytes
        self._sock_dir.chmod(0o755)
        socket = self._sock_dir / "proxy.sock"
        self.proxy = self.proxy_factory(self.ledger, socket)
        await self.proxy.start(unix_socket=socket, port=None)

    async def run(self, task: Task, sample: int) -> Trajectory:
        key = episode_key(task.instance_id, sample)
        result = await run_episode(self.proxy, task, episode_id=_session_id(key, self.ledger),
                                   group_id=task.instance_id, config=self.plan.episode,
                                   metadata={"episode_key": key, "sample": sample, **self.metadata})
        result.trajectory.metadata.update({"episode_key": key, **self.metadata})
        return result.trajectory

    async def stop(self) -> None:
        if self.proxy is not None:
            await self.proxy.stop()
        if self._sock_dir is not None:
            shutil.rmtree(self._sock_dir, ignore_errors=True)


async def run_rollouts(plan: RolloutPlan, proxy_factory) -> list[Trajectory]:
    """Run every unfinished episode of ``plan``; ``proxy_factory(data_dir, socket)`` builds the proxy."""
    outputs = RolloutOutputs(plan.out)
    todo = pending_episodes(plan)
    progress = Progress(len(plan.episodes()), len(plan.episodes()) - len(todo))
    runner = EpisodeRunner(plan, proxy_factory, plan.out / "ledger")
    semaphore = asyncio.Semaphore(plan.concurrency)

    async def one(task: Task, sample: int) -> None:
        async with semaphore:
            progress.running += 1
            progress.update()
            try:
                trajectory = await runner.run(task, sample)
            finally:
                progress.running -= 1
            outputs.add(trajectory)
            progress.update(trajectory)

    try:
        if todo:
            await runner.start()
            # one episode's unexpected failure must not stop the others: it is reported, left out of
            # the outputs, and retried by a rerun on the same --out
            results = await asyncio.gather(*(one(t, k) for t, k in todo), return_exceptions=True)
            for (task, sample), result in zip(todo, results, strict=True):
                if isinstance(result, BaseException):
                    print(f"episode {episode_key(task.instance_id, sample)} failed outside its sandbox: "
                          f"{type(result).__name__}: {result}", file=sys.stderr)
    finally:
        progress.close()
        outputs.close()
        await runner.stop()
    trajectories = list(read_trajectories(plan.out / "trajectories.jsonl"))
    finish_outputs(plan.out, trajectories)
    return trajectories


def finish_outputs(out: Path, trajectories: list[Trajectory]) -> dict[str, Any]:
    """NeMo results (rebuilt, so an interrupt between two appends leaves no gap), GRPO batch and
    summary over every finished episode in ``out``."""
    write_jsonl(out / "nemo_results.jsonl", map(to_nemo_gym_result, trajectories))
    graded = [t for t in trajectories if t.reward is not None]
    write_jsonl(out / "grpo_batch.jsonl", grpo_rows(graded))
    summary = summarize(trajectories)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def summarize(trajectories: list[Trajectory]) -> dict[str, Any]:
    n = len(trajectories)
    resolved = sum(bool(t.grading and t.grading.get("resolved")) for t in trajectories)
    return {
        "episodes": n,
        "status": {s: sum(t.status == s for t in trajectories) for s in ("completed", "timeout", "error")},
        "resolved": resolved,
        "resolved_rate": resolved / n if n else 0.0,
        "masked": sum(t.masked for t in trajectories),
        "failure_kinds": dict(sorted(Counter(t.failure_kind.value for t in trajectories).items())),
        "calls": sum(t.stats.calls for t in trajectories),
        "sampled_tokens": sum(t.stats.sampled_tokens for t in trajectories),
        "trainable_tokens": sum(t.stats.trainable_tokens for t in trajectories),
        "chains": sum(t.stats.chains for t in trajectories),
        "models": sorted({t.model for t in trajectories if t.model}),
        "backends": sorted({t.backend for t in trajectories if t.backend}),
    }


def summary_table(trajectories: list[Trajectory]) -> str:
    rows = [("episode", "status", "turns", "sampled", "trainable", "chains", "reward", "time s")]
    for t in trajectories:
        rows.append((t.session_id, t.status, str(t.stats.calls), str(t.stats.sampled_tokens),
                     str(t.stats.trainable_tokens), str(t.stats.chains),
                     "-" if t.reward is None else f"{t.reward:.1f}",
                     f"{t.metadata.get('duration_s', 0.0):.0f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# -- CLI -------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--harness", default="pi", help="codex | claude-code | pi")
    parser.add_argument("--sandbox", default="auto", choices=SANDBOX_CHOICES,
                        help="where episodes run: auto (a bubblewrap tree for tasks with a base archive, a "
                             "container of the task's image otherwise) or one engine for every task")
    parser.add_argument("--tasks", default="bundled", help="bundled | verified | FILE.jsonl")
    parser.add_argument("--task-ids", nargs="*", default=None, help="only these instance ids")
    parser.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    parser.add_argument("--backend", default="local", help="local | vllm | nemo-rl | sglang")
    parser.add_argument("--url", action="append", default=[], help="backend URL (repeatable)")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="HF model/tokenizer dir (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--model-name", default=None)
    parser.add_argument("--policy", default="model",
                        help="model (the backend samples) or a scripted policy scored by the local model: "
                             "gold (replays the gold patch), noop")
    parser.add_argument("--score-window", type=int, default=1024,
                        help="scripted policies: the model scores each answer given the last N prompt tokens")
    parser.add_argument("--tool-format", choices=["hermes", "qwen3_coder"], default=None)
    parser.add_argument("--samples", type=int, default=1, help="rollouts per task (GRPO group size)")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/rollout"))
    parser.add_argument("--timeout", type=float, default=600.0, help="harness deadline per episode (s)")
    parser.add_argument("--grading-timeout", type=float, default=900.0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=1024, help="per model call")
    parser.add_argument("--max-context", type=int, default=32768)
    parser.add_argument("--outcome", action="append", default=[], type=_outcome_arg, metavar="KIND=mask|REWARD",
                        help="override a row of the outcome table (docs/outcomes.md), e.g. harness_crashed=mask")
    parser.add_argument("--min-backend-tokens-per-s", type=float, default=OutcomeTable().min_backend_tokens_per_s,
                        help="a deadline hit while the backend sampled slower than this is masked, not the policy's")


def _outcome_arg(item: str) -> tuple[FailureKind, Outcome]:
    try:
        return parse_outcome(item)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def plan_from_args(args: argparse.Namespace) -> RolloutPlan:
    from polar_env.tasks.loader import load_tasks

    tasks = load_tasks(args.tasks)
    if args.task_ids:
        tasks = [t for t in tasks if t.instance_id in set(args.task_ids)]
    tasks = tasks[: args.limit] if args.limit else tasks
    if not tasks:
        raise TaskLoadError(f"no tasks selected from {args.tasks!r} (check --task-ids / --limit)")
    policy = {"temperature": args.temperature, "top_p": args.top_p, "max_tokens": args.max_tokens}
    outcomes = OutcomeTable(rows=dict(args.outcome), min_backend_tokens_per_s=args.min_backend_tokens_per_s)
    return RolloutPlan(tasks=tasks, samples=args.samples, concurrency=args.concurrency, out=args.out,
                       episode=EpisodeConfig(harness=args.harness, timeout_s=args.timeout,
                                             grading_timeout_s=args.grading_timeout, policy=policy,
                                             model_name=args.model_name, sandbox=args.sandbox,
                                             outcomes=outcomes))


def proxy_factory_from_args(args: argparse.Namespace, backend=None, tasks: list[Task] | None = None):
    """A factory building the proxy for this run (one model load, reused across reruns)."""
    from polar_env.backends.embedded import embedded_model_dir
    from polar_env.backends.registry import make_backend
    from polar_env.chat.template import ChatRenderer
    from polar_env.proxy.app import ProxyServer
    from polar_env.proxy.engine import EngineConfig

    model_dir = args.model_dir or embedded_model_dir()
    renderer = ChatRenderer.from_pretrained(model_dir, tool_format=args.tool_format)
    if backend is None and getattr(args, "policy", "model") != "model":
        from polar_env.backends.policies import make_policy

        backend = make_backend("scripted", model_dir=model_dir, policy=make_policy(args.policy, tasks or []),
                               context_window=getattr(args, "score_window", 1024))
    backend = backend or make_backend(args.backend, url=args.url or None,
                                      model=args.model_name or model_dir.name, model_dir=model_dir)

    def factory(data_dir: Path, socket: Path) -> ProxyServer:
        return ProxyServer.create(renderer=renderer, backend=backend, data_dir=data_dir,
                                  admin_secret=secrets.token_urlsafe(24),
                                  config=EngineConfig(max_context=args.max_context,
                                                      default_max_tokens=args.max_tokens))

    return factory


def prepare(plan: RolloutPlan) -> None:
    """Host-side setup and checks before the clock starts: each task's workspace can be made here
    (engine, image), the harness is installed, and each bubblewrap task's test env is built."""
    from polar_env.episodes.workspace import check_engine, check_image, workspace_kind
    from polar_env.harness_adapters.registry import get_adapter
    from polar_env.tasks.env import ensure_task_env

    kinds = {t.instance_id: workspace_kind(t, plan.episode.sandbox) for t in plan.tasks}
    for kind in set(kinds.values()):
        check_engine(kind)
    for task in plan.tasks:
        check_image(task, kinds[task.instance_id])
    get_adapter(plan.episode.harness).install()
    if plan.episode.grade:
        for task in plan.tasks:
            if kinds[task.instance_id] == "bubblewrap":
                ensure_task_env(task)


def rollout_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="polar rollout", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--ray", nargs="?", const="auto", default=None, metavar="ADDRESS",
                        help="spread the episodes over this Ray cluster's nodes, each with its own proxy "
                             "and sandboxes (no ADDRESS or 'auto': the cluster running on this machine)")
    args = parser.parse_args(argv)
    try:
        plan = plan_from_args(args)
        if not args.ray:
            prepare(plan)
    except (TaskLoadError, WorkspaceUnavailable) as exc:
        print(f"polar rollout: {exc}", file=sys.stderr)
        return 2
    try:
        if args.ray:
            from polar_env.rollout_ray import run_on_ray

            trajectories = run_on_ray(plan, args)
        else:
            trajectories = asyncio.run(run_rollouts(plan, proxy_factory_from_args(args, tasks=plan.tasks)))
    except KeyboardInterrupt:
        left = len(pending_episodes(plan))
        print(f"\ninterrupted: {len(plan.episodes()) - left} of {len(plan.episodes())} episodes are in "
              f"{plan.out}; run the same command again to do the other {left}", file=sys.stderr)
        return 130
    print(summary_table(trajectories))
    print(json.dumps(summarize(trajectories), indent=2))
    return 0

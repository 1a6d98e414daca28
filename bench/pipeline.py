"""The `pipeline` family: how busy the rollout driver keeps the inference server.

Two runs of the same episodes in one process, one after the other: the driver with its stage
limits (prepare and grade slots at their defaults, two live harnesses beyond each run slot), then the same
driver collapsed into one slot held over prepare, run and grade (the driver before the stages). Each is
`rollout.runner.run_rollouts` itself: Pi in bubblewrap on the bundled tasks, the `gold-steps`
policy (five calls, four of them tools), graded by the real grader. The backend is
SimulatedBackend, which sleeps 20 ms per answer token without using the CPU, as calls to a GPU
server cost the rollout machine none; its trace gives the busy fraction.

Busy fraction = the mean number of backend calls in flight / run slots, over the steady state:
from the moment the run_slots-th episode made its first model call (every run slot has had an
episode: the warm-up is over) to the moment the last episode made its first model call (after it
no episode is left to fill a slot that frees: the drain tail). An episode's first call reaching
the backend is when it entered its run stage, for either driver.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polar_env.backends.simulated import CallSpan
from polar_env.trajectory.accepted import accepted_work

RUN_SLOTS = 4
PER_TOKEN_S = 0.02  # a 100-token answer takes 2 s
POLICY = "gold-steps"
HARNESS = "pi"
DRIVERS = ("staged", "collapsed")


def in_flight(spans: Sequence[CallSpan], t0: float, t1: float) -> float:
    """The mean number of calls in flight between ``t0`` and ``t1``."""
    if t1 <= t0:
        raise ValueError(f"empty window [{t0}, {t1}]")
    return sum(max(0.0, min(s.end, t1) - max(s.start, t0)) for s in spans) / (t1 - t0)


def run_entries(spans: Sequence[CallSpan]) -> list[float]:
    """When each session's first call started (its episode entered the run stage), in order."""
    first: dict[str | None, float] = {}
    for s in spans:
        first[s.session_id] = min(s.start, first.get(s.session_id, s.start))
    return sorted(first.values())


def steady_window(spans: Sequence[CallSpan], run_slots: int) -> tuple[float, float] | None:
    """The steady state (module docstring); None when there is none (no more episodes than slots)."""
    entries = run_entries(spans)
    if len(entries) <= run_slots or entries[-1] <= entries[run_slots - 1]:
        return None
    return entries[run_slots - 1], entries[-1]


def busy_fraction(spans: Sequence[CallSpan], run_slots: int) -> float | None:
    window = steady_window(spans, run_slots)
    return None if window is None else in_flight(spans, *window) / run_slots


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def stage_split(trajectories: Sequence[Any]) -> dict[str, float | None]:
    """Mean seconds per stage over the trajectories' ``metadata.timings`` (each key they have)."""
    timings = [t.metadata.timings.model_dump() for t in trajectories if t.metadata.timings is not None]
    keys = sorted({k for t in timings for k in t})
    return {k: _mean([t[k] for t in timings if t.get(k) is not None]) for k in keys}


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine since boot (``/proc/stat``), every job's: the
    sandboxes' own CPU is not ours to count (bubblewrap's pid namespace hides it from rusage)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def trace_figures(spans: Sequence[CallSpan], run_slots: int) -> dict[str, Any]:
    window = steady_window(spans, run_slots)
    return {
        "busy_fraction": busy_fraction(spans, run_slots),
        "steady_window_s": None if window is None else window[1] - window[0],
        # how fast episodes entered the run stage in the steady state: the inference side's rate,
        # which episodes/hour follows only where grading keeps up with it
        "run_entries_per_hour": None
        if window is None
        else (len(run_entries(spans)) - run_slots) / (window[1] - window[0]) * 3600,
        "mean_calls_in_flight": None if window is None else in_flight(spans, *window),
        "backend_calls": len(spans),
        "tokens_per_call": _mean([s.tokens for s in spans]),
        "seconds_per_call": _mean([s.end - s.start for s in spans]),
    }


async def run_driver(name: str, plan: Any, factory: Any, backend: Any) -> dict[str, Any]:
    """One driver's run of ``plan``: throughput, the backend's busy fraction, the stage split."""
    from polar_env.rollout.runner import run_rollouts

    load0, cpu0, t0 = os.getloadavg(), cpu_jiffies(), time.monotonic()
    trajectories = await run_rollouts(plan, factory)
    wall, cpu1 = time.monotonic() - t0, cpu_jiffies()
    statuses = Counter(t.status for t in trajectories)
    if statuses["error"]:
        errors = [t.error for t in trajectories if t.status == "error"]
        raise RuntimeError(f"{name}: {statuses['error']} episodes failed: {errors[:3]}")
    prepare_slots, lookahead, grade_slots = plan.limits()
    return {
        "driver": name,
        "run_slots": plan.run_slots,
        "collapsed": plan.collapsed,
        "prepare_slots": prepare_slots,
        "lookahead": lookahead,
        "grade_slots": grade_slots,
        "episodes": len(trajectories),
        "wall_s": wall,
        "episodes_per_hour": len(trajectories) / wall * 3600,
        "status": dict(statuses),
        "resolved": sum(bool(t.grading and t.grading.resolved) for t in trajectories),
        **trace_figures(backend.trace, plan.run_slots),
        # the warm-up before the first model call, and the drain tail (last gradings) after the last
        "before_first_call_s": min(c.start for c in backend.trace) - t0,
        "after_last_call_s": t0 + wall - max(c.end for c in backend.trace),
        "stages_mean_s": stage_split(trajectories),
        # what the trainer keeps, per hour and run slot (summary.json's accepted_work: trajectory/accepted.py)
        "accepted_work": accepted_work(trajectories),
        "episode_s": _mean([t.metadata.duration_s or 0.0 for t in trajectories]),
        "machine_cpu_busy": (cpu1[0] - cpu0[0]) / max(1, cpu1[1] - cpu0[1]),
        "load_avg_before": list(load0),
        "load_avg_after": list(os.getloadavg()),
    }


async def measure(
    workdir: Path,
    *,
    samples: int = 4,
    run_slots: int = RUN_SLOTS,
    lookahead: int = RUN_SLOTS,
    per_token_s: float = PER_TOKEN_S,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Both drivers over the bundled tasks x ``samples``, at ``run_slots``; the staged one first, with
    ``lookahead`` live harnesses beyond the run slots (Pi's start-up alone, under load, takes about
    as long as a run stage: with the default of one per run slot, slots wait on start-ups)."""
    from polar_env.backends.embedded import embedded_model_dir
    from polar_env.backends.scripted import PolicyAnswers
    from polar_env.backends.simulated import SimulatedBackend
    from polar_env.chat.template import ChatRenderer
    from polar_env.episodes import EpisodeSettings
    from polar_env.harness_adapters.policies import make_policy
    from polar_env.rewards.grading import gold_reference
    from polar_env.rollout.config import RolloutConfig
    from polar_env.rollout.plan import RolloutPlan
    from polar_env.rollout.runner import prepare, proxy_factory
    from polar_env.tasks.loader import load_tasks

    tasks = load_tasks("bundled")
    renderer = ChatRenderer.from_pretrained(embedded_model_dir())
    episode = EpisodeSettings(harness=HARNESS, timeout=timeout_s, sandbox="bubblewrap")
    out: dict[str, Any] = {
        "harness": HARNESS,
        "policy": POLICY,
        "tasks": len(tasks),
        "samples": samples,
        "run_slots": run_slots,
        "per_token_s": per_token_s,
        "cores": os.cpu_count(),
        "order": list(DRIVERS),
        "drivers": {},
    }
    plans = {
        "staged": RolloutPlan(
            tasks=tasks,
            samples=samples,
            run_slots=run_slots,
            out=workdir / "staged",
            episode=episode,
            lookahead=lookahead,
        ),
        "collapsed": RolloutPlan(
            tasks=tasks,
            samples=samples,
            run_slots=run_slots,
            out=workdir / "collapsed",
            episode=episode,
            collapsed=True,
        ),
    }
    # before the clock: the harness install and task test envs, and the grader's gold reference (once
    # per task and process), which would otherwise be the first driver's alone to make
    await asyncio.to_thread(prepare, plans[DRIVERS[0]])
    await asyncio.gather(*(asyncio.to_thread(gold_reference, task) for task in tasks))
    for name, plan in plans.items():
        answers = PolicyAnswers(renderer.tokenizer, make_policy(POLICY, tasks), renderer.eos_token_ids[0])
        backend = SimulatedBackend(answers, per_token_s=per_token_s)
        factory = proxy_factory(RolloutConfig(harness=HARNESS), backend=backend)
        out["drivers"][name] = await run_driver(name, plan, factory, backend)
    staged, collapsed = (out["drivers"][d]["episodes_per_hour"] for d in DRIVERS)
    out["episodes_per_hour_ratio"] = staged / collapsed
    return out

"""Where an episode's time went, per stage, from its stage marks, its run slot's times and its calls'
own timings."""

from __future__ import annotations

from polar_env.episodes.episode import Episode
from polar_env.trajectory.records import CallRecord

# metadata["timings"] of every trajectory, in seconds: waiting for a prepare slot, preparing, the
# harness's start-up (start to its first model call), waiting for a run slot, the model's time
# (backend calls, overlaps counted once), the rest of the run (tools, the harness's own work),
# then patch + drain + classification, the trajectory build, and grading (with the workspace's close)
TIMING_KEYS = (
    "queued_s",
    "prepare_s",
    "harness_start_s",
    "wait_s",
    "model_s",
    "tool_s",
    "drain_s",
    "build_s",
    "grade_s",
)


def episode_timings(ep: Episode, calls: list[CallRecord]) -> dict[str, float]:
    """Where the episode's time went (:data:`TIMING_KEYS`), from its stage marks, its slot's times
    and its calls' own timings."""
    m = ep.marks
    prepared = m.get("prepare", m["queued"])
    started = m.get("started", prepared)
    ended = m.get("ended", started)
    first_call = (
        ep.slot.first_call_at if ep.slot is not None else min((c.created_at for c in calls), default=None)
    )
    admitted_at = (
        ep.slot.admitted_at if ep.slot is not None and ep.slot.admitted_at is not None else first_call
    )
    spans = sorted(
        (c.created_at + c.timings.get("admission_ms", 0.0) / 1e3, c.created_at + c.timings["total_ms"] / 1e3)
        for c in calls
        if "total_ms" in c.timings
    )
    model = covered = 0.0
    for begin_at, end in spans:  # the union: side calls in parallel count once
        begin_at = max(begin_at, covered)
        if end > begin_at:
            model += end - begin_at
            covered = end
    run_s = ended - admitted_at if admitted_at is not None else 0.0
    first_wait = admitted_at - first_call if first_call is not None and admitted_at is not None else 0.0
    waited = (
        max(ep.slot.waited_s(ended), first_wait) if ep.slot is not None else first_wait
    )  # every call's wait
    out = {
        "queued_s": prepared - m["queued"],
        "prepare_s": started - prepared,
        "harness_start_s": (first_call if first_call is not None else ended) - started,
        "wait_s": waited,
        "model_s": model,
        "tool_s": run_s - model - (waited - first_wait),
        "drain_s": m.get("build", ended) - ended,
        "build_s": m.get("grade", ended) - m.get("build", ended),
        "grade_s": m.get("done", ended) - m.get("grade", ended),
    }
    return {k: round(max(v, 0.0), 4) for k, v in out.items()}

"""Where an episode's time went: one schema (``EpisodeTimings``, polar_env.trajectory.models) filled
by one function (:func:`episode_timings`), whichever driver ran the episode (docs/rollout.md, "Where
an episode's time goes"). It is the trajectory's ``metadata.timings``, what /metrics observes
(``metrics.episode_finished``), what the rollout summary averages (rollout/outputs.py) and the NeMo Gym
``/run`` result's ``polar.timings`` (agent_server/core.py)."""

from __future__ import annotations

from polar_env.proxy.run_slots import SlotTimes
from polar_env.trajectory.models import EpisodeTimings
from polar_env.trajectory.records import CallRecord

TIMING_KEYS = tuple(EpisodeTimings.model_fields)


def episode_timings(
    marks: dict[str, float], slot: SlotTimes | None, calls: list[CallRecord], *, opened: float
) -> EpisodeTimings:
    """Where the episode's time went, from its stage marks (``Episode.marks``), its run slot's times,
    its calls' own timings and when its session ``opened``."""
    m = marks
    prepared = m.get("prepare", m["queued"])
    started = m.get("started", prepared)
    ended = m.get("ended", started)
    done = m.get("done", ended)
    closing = m.get("closing", done)
    first_call = slot.first_call_at if slot is not None else min((c.created_at for c in calls), default=None)
    admitted_at = slot.admitted_at if slot is not None and slot.admitted_at is not None else first_call
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
    waited = max(slot.waited_s(ended), first_wait) if slot is not None else first_wait  # every call's wait
    seconds = {
        "queued_s": prepared - m["queued"],
        "prepare_s": started - prepared,
        "harness_start_s": (first_call if first_call is not None else ended) - started,
        "wait_s": waited,
        "model_s": model,
        "tool_s": run_s - model - (waited - first_wait),
        "drain_s": m.get("build", ended) - ended,
        "build_s": m.get("grade", ended) - m.get("build", ended),
        "grade_s": closing - m.get("grade", ended),
        "close_s": done - closing,
        "harness_s": ended - started,
        "total_s": done - opened,
    }
    return EpisodeTimings(**{k: round(max(v, 0.0), 4) for k, v in seconds.items()})

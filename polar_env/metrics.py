"""Prometheus metrics of a Polar process (docs/rollout.md, "Watching a run").

One registry per process (prometheus_client's default, so a process's other collectors, e.g.
its own CPU and memory, come along): the proxy's model calls (per wire API: calls, tokens in
and out, latency, failures by kind, run-slot waits), the inference backend's busy fraction, the
episodes' stage occupancy and outcomes (failures by kind, masked fraction, grading, sandbox and
harness start times, policy-version lag) and the run's accepted work. The proxy, the rollout
driver and the Gym agent update it; the proxy's TCP listener, ``polar rollout --metrics-port``
and the Gym agent serve it at ``/metrics`` in Prometheus's text format.

The per-call updates are a few dictionary lookups and additions (microseconds of a call whose
proxy budget is 1.5 ms): the busy fraction is integrated in plain floats here and turned into
samples only when scraped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

CALL_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
STAGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
LAG_BUCKETS = (0.0, 1.0, 2.0, 3.0, 4.0, 8.0, 16.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST

MODEL_CALLS = Counter(
    "polar_model_calls",
    "Model calls the proxy finished, by wire API and outcome (ok, failed)",
    ["api", "outcome"],
)
PROMPT_TOKENS = Counter(
    "polar_prompt_tokens", "Prompt tokens of the model calls the backend answered", ["api"]
)
GENERATION_TOKENS = Counter("polar_generation_tokens", "Tokens the backend sampled", ["api"])
CALL_FAILURES = Counter(
    "polar_model_call_failures", "Failed model calls by failure kind (docs/outcomes.md)", ["api", "kind"]
)
CALL_SECONDS = Histogram(
    "polar_model_call_duration_seconds",
    "A model call's time in the proxy, its run-slot wait and the backend's generation included",
    ["api"],
    buckets=CALL_BUCKETS,
)
RUN_SLOT_WAIT = Histogram(
    "polar_run_slot_wait_seconds",
    "How long a model call waited for a run slot (proxy/run_slots.py)",
    buckets=CALL_BUCKETS,
)
POLICY_VERSION = Gauge("polar_policy_version", "The policy version the proxy serves (the trainer sets it)")
EPISODE_STAGE = Gauge(
    "polar_episodes_in_stage", "Episodes in each stage now (prepare, wait, run, finish)", ["stage"]
)
EPISODES = Counter(
    "polar_episodes",
    "Finished episodes by failure kind and whether they are masked",
    ["failure_kind", "masked"],
)
RESOLVED = Counter("polar_episodes_resolved", "Finished episodes whose patch resolved the task")
TRAINABLE_TOKENS = Counter(
    "polar_trainable_tokens", "Trainable (loss-mask 1) tokens of finished episodes", ["masked"]
)
GRADING_SECONDS = Histogram(
    "polar_grading_duration_seconds", "Grading time per episode", buckets=STAGE_BUCKETS
)
SANDBOX_START_SECONDS = Histogram(
    "polar_sandbox_start_duration_seconds",
    "Preparing an episode: the harness install checked, the workspace and sandbox made, the harness started",
    buckets=STAGE_BUCKETS,
)
HARNESS_START_SECONDS = Histogram(
    "polar_harness_start_duration_seconds", "A harness's start to its first model call", buckets=STAGE_BUCKETS
)
POLICY_LAG = Histogram(
    "polar_episode_policy_lag_versions",
    "Versions between the policy an episode's first call was sampled by and the one served when it finished",
    buckets=LAG_BUCKETS,
)

for _stage in ("prepare", "wait", "run", "finish"):  # present at 0 before the first episode
    EPISODE_STAGE.labels(_stage)


class Busy:
    """The backend's calls in flight integrated over time: its busy slot-seconds, and the busy
    fraction (mean calls in flight / inference slots) since the run set its slots. Updated on the
    event loop; read by the scrape (floats: a torn read is off by one call at most)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.integral = 0.0  # slot-seconds busy since the process started
        self.since = time.monotonic()
        self.slots: int | None = None
        self._start: tuple[float, float] | None = None  # (when, integral) at start()

    def _advance(self) -> float:
        now = time.monotonic()
        self.integral += self.in_flight * (now - self.since)
        self.since = now
        return now

    def enter(self) -> None:
        self._advance()
        self.in_flight += 1

    def leave(self) -> None:
        self._advance()
        self.in_flight -= 1

    def start(self, slots: int) -> None:
        """A run begins with ``slots`` inference slots (its run slots, or its episode concurrency)."""
        now = self._advance()
        self.slots, self._start = max(1, slots), (now, self.integral)

    def busy_seconds(self) -> float:
        return self.integral + self.in_flight * (time.monotonic() - self.since)

    def fraction(self) -> float | None:
        """Mean calls in flight / slots since ``start``; None before it (or at once after it)."""
        if self._start is None or self.slots is None:
            return None
        began, at = self._start
        elapsed = time.monotonic() - began
        return None if elapsed <= 0 else (self.busy_seconds() - at) / (elapsed * self.slots)


BUSY = Busy()


class _Tally:
    """Episodes and masked episodes finished in this process (the masked fraction's parts)."""

    def __init__(self) -> None:
        self.episodes = self.masked = 0


_TALLY = _Tally()
_figures: dict[str, Callable[[], dict[str, Any]]] = {}  # gauge prefix -> the run's current figures
_call_children: dict[str, tuple[Any, ...]] = {}


def _children(api: str) -> tuple[Any, ...]:
    """The labelled series of ``api`` (looked up once: ``labels()`` takes a lock and builds a key)."""
    found = _call_children.get(api)
    if found is None:
        found = _call_children[api] = (
            MODEL_CALLS.labels(api, "ok"),
            PROMPT_TOKENS.labels(api),
            GENERATION_TOKENS.labels(api),
            CALL_SECONDS.labels(api),
            MODEL_CALLS.labels(api, "failed"),
        )
    return found


def call_answered(api: str, prompt_tokens: int, generated_tokens: int, seconds: float) -> None:
    calls, prompt, generated, latency, _failed = _children(api)
    calls.inc()
    prompt.inc(prompt_tokens)
    generated.inc(generated_tokens)
    latency.observe(seconds)


def call_failed(api: str, kind: str, seconds: float) -> None:
    children = _children(api)
    children[4].inc()
    children[3].observe(seconds)
    CALL_FAILURES.labels(api, kind).inc()


def episode_finished(
    *,
    failure_kind: str,
    masked: bool,
    resolved: bool,
    trainable_tokens: int,
    timings: dict[str, float],
    policy_lag: int | None,
) -> None:
    """One finished episode's outcome and stage times (``timings``: episodes/timings.py TIMING_KEYS)."""
    EPISODES.labels(failure_kind, "true" if masked else "false").inc()
    TRAINABLE_TOKENS.labels("true" if masked else "false").inc(trainable_tokens)
    if resolved:
        RESOLVED.inc()
    _TALLY.episodes += 1
    _TALLY.masked += masked
    for histogram, key in (
        (GRADING_SECONDS, "grade_s"),
        (SANDBOX_START_SECONDS, "prepare_s"),
        (HARNESS_START_SECONDS, "harness_start_s"),
    ):
        if (value := timings.get(key)) is not None:
            histogram.observe(value)
    if policy_lag is not None:
        POLICY_LAG.observe(policy_lag)


def stage(name: str) -> Any:
    """A context manager counting an episode in stage ``name`` while it is inside."""
    return EPISODE_STAGE.labels(name).track_inprogress()


def publish_figures(prefix: str, source: Callable[[], dict[str, Any]]) -> None:
    """Expose ``source()``'s numbers as gauges ``polar_<prefix>_<key>`` at every scrape (the last
    run to publish a prefix owns it: a process runs one job at a time)."""
    _figures[prefix] = source


class _Live(Collector):
    """What is computed at scrape time: the busy fraction, the masked fraction, published figures."""

    def collect(self) -> Iterator[Any]:
        yield GaugeMetricFamily(
            "polar_backend_calls_in_flight", "Model calls the backend is generating now", value=BUSY.in_flight
        )
        yield CounterMetricFamily(
            "polar_backend_busy_seconds",
            "Backend calls in flight integrated over time "
            "(slot-seconds): rate() of it over polar_inference_slots is the busy fraction",
            value=BUSY.busy_seconds(),
        )
        if BUSY.slots is not None:
            yield GaugeMetricFamily(
                "polar_inference_slots",
                "The run's inference slots (run slots, else its episode concurrency)",
                value=BUSY.slots,
            )
        if (fraction := BUSY.fraction()) is not None:
            yield GaugeMetricFamily(
                "polar_inference_busy_fraction",
                "Mean backend calls in flight / inference slots since the run started",
                value=fraction,
            )
        if _TALLY.episodes:
            yield GaugeMetricFamily(
                "polar_masked_fraction",
                "Finished episodes that are masked (no loss)",
                value=_TALLY.masked / _TALLY.episodes,
            )
        for prefix, source in list(_figures.items()):
            for key, value in source().items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    yield GaugeMetricFamily(
                        f"polar_{prefix}_{key}", f"{prefix}: {key} (summary.json)", value=value
                    )


REGISTRY.register(_Live())


def exposition() -> bytes:
    """Every metric of this process in Prometheus's text format."""
    return generate_latest(REGISTRY)


def parse_address(value: str) -> tuple[str, int]:
    """``PORT`` (loopback) or ``HOST:PORT``: where ``--metrics-port`` serves."""
    host, _, port = value.rpartition(":")
    return host or "127.0.0.1", int(port)


class MetricsServer:
    """``/metrics`` on its own HTTP listener (prometheus_client's, on a daemon thread), for a process
    with no HTTP server of its own to add the route to (``polar rollout``, ``demo``, ``train``)."""

    def __init__(self, address: str):
        from prometheus_client import start_http_server

        host, port = parse_address(address)
        self._server, self._thread = start_http_server(port, host)
        self.host, self.port = host, self._server.server_port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

"""Watching a run (docs/rollout.md, "Watching a run"): the proxy's ``/metrics`` read with
prometheus_client's own text parser as calls go through it (and never served to the sandboxes'
socket); a live ``polar rollout`` scraped twice while it runs, its ``--report-to tensorboard``
events read back with TensorBoard's own reader and its accepted-work figure; the first-hour
mistakes of the rollout flags are one-line errors."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from gym_helpers import free_port
from proxy_client import post, running_proxy
from repo_paths import REPO
from scrape_helpers import samples, scrape, value

from polar_env import metrics
from polar_env.backends.base import Generation
from polar_env.backends.instant import InstantBackend
from polar_env.cli import main as polar_main
from polar_env.proxy.run_slots import RunSlots


def chat(text: str) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 8}


async def scrape_async(http: aiohttp.ClientSession, url: str) -> dict:
    async with http.get(url) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        return samples(await resp.text())


async def test_proxy_metrics_move_with_its_calls_and_stay_off_the_sandbox_socket(
    renderer, proxy_factory, tmp_path
):
    answer = renderer.tokenizer.encode("Hello there.", add_special_tokens=False) + renderer.eos_token_ids[:1]
    sock = tmp_path / "sock" / "proxy.sock"
    sock.parent.mkdir()
    proxy = proxy_factory(
        InstantBackend(answer), admin_secret="secret", max_context=2048, default_max_tokens=64
    )
    await proxy.start(
        "127.0.0.1", free_port(), unix_socket=sock
    )  # as `polar proxy serve` and the drivers listen
    try:
        async with aiohttp.ClientSession() as http:
            metrics.BUSY.start(2)
            url = f"{proxy.base_url}/metrics"
            sid, key = proxy.create_session("watched")
            base = f"{proxy.base_url}/s/{sid}/v1"
            before = await scrape_async(http, url)
            for n in range(3):
                assert (await post(http, f"{base}/chat/completions", chat(f"question {n}"), key))[0] == 200
            status, _ = await post(
                http, f"{base}/chat/completions", chat("word " * 3000), key
            )  # past the context
            assert status == 400
            after = await scrape_async(http, url)

            def moved(name: str, **labels: str) -> float:
                return value(after, name, **labels) - value(before, name, **labels)

            assert moved("polar_model_calls_total", api="chat", outcome="ok") == 3
            assert moved("polar_model_calls_total", api="chat", outcome="failed") == 1
            assert moved("polar_model_call_failures_total", api="chat", kind="context_overflow") == 1
            assert moved("polar_model_call_duration_seconds_count", api="chat") == 4
            assert moved("polar_generation_tokens_total", api="chat") == 3 * len(answer)
            assert value(after, "polar_prompt_tokens_total", api="chat") > value(
                before, "polar_prompt_tokens_total", api="chat"
            )
            # the latency histogram filled its buckets; the busy fraction is there, a fraction
            assert value(after, "polar_model_call_duration_seconds_bucket", api="chat", le="+Inf") >= 4
            assert 0.0 <= value(after, "polar_inference_busy_fraction") <= 1.0
            assert ("polar_inference_busy_fraction", ()) in after and value(
                after, "polar_inference_slots"
            ) == 2
            # the sandboxes reach the proxy through its Unix socket: the run's figures are not theirs to read
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock))) as local:
                async with local.get("http://proxy/metrics") as resp:
                    assert resp.status == 404
    finally:
        await proxy.stop()


class _Held:
    """A backend whose answers wait until released (a model call kept generating)."""

    def __init__(self, answer: list[int]):
        self.name, self.model, self.answer = "held", "held", answer
        self.release = asyncio.Event()

    async def generate(self, prompt_ids, sampling, *, session_id=None) -> Generation:
        await self.release.wait()
        return Generation(
            prompt_ids=prompt_ids,
            token_ids=self.answer,
            logprobs=[-0.1] * len(self.answer),
            finish_reason="stop",
            backend="held",
            model="held",
        )

    async def aclose(self) -> None:
        """Nothing to release."""


async def test_a_call_waiting_for_a_run_slot_when_its_episode_ends_is_answered_without_a_traceback(
    renderer, tmp_path, caplog
):
    """Ctrl-C of `polar rollout` ends every episode; a harness call still waiting for a run slot then
    fails with RunEnded. It is the episode's end, not a proxy bug: a 400 in the API's shape, and no
    error with a traceback on the user's terminal (two of them, before this fix)."""
    backend = _Held(renderer.tokenizer.encode("ok", add_special_tokens=False) + renderer.eos_token_ids[:1])
    async with (
        running_proxy(
            renderer,
            backend,
            tmp_path / "ledger",
            max_context=2048,
            default_max_tokens=8,
        ) as proxy,
        aiohttp.ClientSession() as http,
    ):
        proxy.engine.run_slots = slots = RunSlots(1)
        (a, key_a), (b, key_b) = proxy.create_session("a"), proxy.create_session("b")
        holding = asyncio.ensure_future(
            post(http, f"{proxy.base_url}/s/{a}/v1/chat/completions", chat("hi"), key_a)
        )
        while not slots.busy:
            await asyncio.sleep(0.01)
        waiting = asyncio.ensure_future(
            post(http, f"{proxy.base_url}/s/{b}/v1/chat/completions", chat("hi"), key_b)
        )
        while not slots.waiting:
            await asyncio.sleep(0.01)
        with caplog.at_level(logging.INFO):
            slots.release(b)  # what the driver does to an episode it aborts
            status, body = await waiting
        backend.release.set()
        assert (await holding)[0] == 200
    assert status == 400 and "episode stopped" in body["error"]["message"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text


@pytest.mark.parametrize("command", ["rollout", "demo", "train"])
@pytest.mark.parametrize(
    "flags,error",
    [
        (["--samples", "0"], "--samples: must be 1 or more (got 0)"),
        (["--samples", "-1"], "--samples: must be 1 or more (got -1)"),
        (["--out", "FILE"], "is a file; --out names the job's directory"),
    ],
)
def test_job_flags_a_user_gets_wrong_are_one_line_errors(command, flags, error, tmp_path, capsys):
    """`--samples 0` and `-1` used to exit 0 having done nothing; `--out` naming a file, a 28-line
    traceback."""
    (tmp_path / "FILE").write_text("not a directory\n")
    flags = [str(tmp_path / "FILE") if f == "FILE" else f for f in flags]
    with pytest.raises(SystemExit) as exited:
        polar_main([command, *flags])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and error in err and "Traceback" not in err, err


def test_accepted_work_counts_what_the_trainer_keeps():
    """Accepted: unmasked, in a group that still has two unmasked samples; per hour of the episodes'
    own spans, per run slot and per GPU; the dropped and stale fractions beside it."""
    from polar_env.trajectory.accepted import Sample, accepted_work

    def sample(group: str, masked: bool, tokens: int, start: float, versions=(3,)) -> Sample:
        return Sample(group, masked, tokens, start, start + 1800.0, 2, "", 4, tuple(versions))

    figure = accepted_work(
        [
            sample("a", False, 100, 0.0),
            sample("a", False, 300, 0.0, (2, 3)),
            sample("b", False, 1000, 1800.0),
            sample("b", True, 50, 1800.0),  # b is too thin
            sample("c", True, 10, 7200.0),
        ]
    )  # an hour later: the gap is no run time
    assert figure["accepted_episodes"] == 2 and figure["accepted_trainable_tokens"] == 400
    assert figure["hours"] == 1.5 and figure["accepted_tokens_per_hour"] == pytest.approx(400 / 1.5)
    assert figure["accepted_tokens_per_run_slot_hour"] == pytest.approx(400 / 1.5 / 2)
    assert figure["accepted_tokens_per_gpu_hour"] == pytest.approx(400 / 1.5 / 4)
    assert figure["drop_fraction"] == 3 / 5 and figure["masked_fraction"] == 2 / 5
    assert figure["stale_fraction"] == 1 / 5  # one episode began on version 2 while 3 was served


# -- a live `polar rollout`, as a user runs it ---------------------------------------------------------
needs_sandbox = pytest.mark.needs("bwrap", "npm")


def _read_until(proc: subprocess.Popen, log: Path, pattern: str, timeout_s: float) -> re.Match:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := re.search(pattern, log.read_text(errors="replace")):
            return found
        assert proc.poll() is None, f"polar rollout ended early:\n{log.read_text(errors='replace')[-3000:]}"
        time.sleep(0.5)
    raise AssertionError(f"no {pattern!r} within {timeout_s:g} s:\n{log.read_text(errors='replace')[-3000:]}")


@pytest.mark.slow
@needs_sandbox
def test_a_live_rollout_is_scraped_twice_and_reports_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, log = tmp_path / "run", tmp_path / "rollout.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "polar_env.cli",
                "rollout",
                "--policy",
                "gold",
                "--task-ids",
                "pallets__flask-5014",
                "--samples",
                "2",
                "--concurrency",
                "2",
                "--metrics-port",
                "0",
                "--report-to",
                "tensorboard",
                "--out",
                str(out),
            ],
            cwd=REPO,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        url = _read_until(proc, log, r"metrics at (http://\S+/metrics)", 300).group(1)
        # first scrape: the first model call has been answered
        deadline = time.monotonic() + 600
        while not value(first := scrape(url), "polar_model_calls_total", api="chat", outcome="ok"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        # second scrape, while it still runs: more calls answered than at the first
        while value(second := scrape(url), "polar_model_calls_total", api="chat", outcome="ok") <= value(
            first, "polar_model_calls_total", api="chat", outcome="ok"
        ):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    for name in (
        "polar_generation_tokens_total",
        "polar_prompt_tokens_total",
        "polar_model_call_duration_seconds_count",
    ):
        assert value(second, name, api="chat") > value(first, name, api="chat") > 0, name
    assert value(second, "polar_model_call_duration_seconds_bucket", api="chat", le="+Inf") >= 2
    assert value(second, "polar_run_slot_wait_seconds_count") >= 2  # every call passed the run slots
    assert 0.0 < value(second, "polar_inference_busy_fraction") <= 1.0
    assert value(second, "polar_inference_slots") == 2
    assert (
        sum(value(second, "polar_episodes_in_stage", stage=s) for s in ("prepare", "wait", "run", "finish"))
        >= 1
    )
    summary = json.loads((out / "summary.json").read_text())
    work = summary["accepted_work"]
    assert summary["resolved"] == 2 and work["accepted_episodes"] == 2 and work["run_slots"] == 2
    assert work["accepted_trainable_tokens"] == summary["trainable_tokens"] > 0
    assert work["accepted_tokens_per_hour"] > 0 and work["drop_fraction"] == 0.0
    # the run's figures in TensorBoard, under summary.json's keys, read by TensorBoard's own reader
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {
        "resolved",
        "trainable_tokens",
        "accepted_work/accepted_tokens_per_hour",
        "status/completed",
        "timings_mean_s/model_s",
    } <= tags, tags
    (resolved,) = events.Scalars("resolved")
    assert resolved.value == 2 and resolved.step == 2
    assert math.isclose(
        events.Scalars("accepted_work/accepted_tokens_per_hour")[0].value,
        work["accepted_tokens_per_hour"],
        rel_tol=1e-6,
    )

"""The pipeline benchmark's pieces: busy fraction from a call trace, the simulated backend's
latency and trace, the five-step scripted policy (no harness: `polar bench --only pipeline` runs them)."""

from __future__ import annotations

import asyncio
import json

import pytest

from bench.pipeline import busy_fraction, in_flight, run_entries, steady_window, trace_figures
from polar_env.backends.base import SamplingParams
from polar_env.backends.scripted import PolicyAnswers
from polar_env.backends.simulated import CallSpan, SimulatedBackend
from polar_env.harness_adapters.policies import make_policy
from polar_env.tasks.loader import load_tasks


def test_in_flight_is_the_time_weighted_mean_over_the_window() -> None:
    spans = [CallSpan("a", 0.0, 4.0, 1), CallSpan("b", 2.0, 6.0, 1)]
    assert in_flight(spans, 0.0, 4.0) == pytest.approx(1.5)  # a throughout, b for half
    assert in_flight(spans, 4.0, 6.0) == pytest.approx(1.0)
    assert in_flight(spans, 6.0, 8.0) == 0.0
    with pytest.raises(ValueError):
        in_flight(spans, 3.0, 3.0)


def test_steady_window_runs_from_the_slots_filling_to_the_last_episodes_entry() -> None:
    # four sessions, two slots: the 2nd session's first call opens the window, the 4th's closes it
    spans = [
        CallSpan("s1", 0.0, 3.0, 1),
        CallSpan("s1", 3.5, 5.0, 1),
        CallSpan("s2", 1.0, 4.0, 1),
        CallSpan("s3", 5.0, 7.0, 1),
        CallSpan("s4", 6.0, 9.0, 1),
        CallSpan("s4", 9.0, 20.0, 1),
    ]
    assert run_entries(spans) == [0.0, 1.0, 5.0, 6.0]
    assert steady_window(spans, 2) == (1.0, 6.0)
    # in [1, 6]: s1 2.0 + 1.5, s2 3.0, s3 1.0 -> 7.5 call-seconds over 5 s on 2 slots
    assert busy_fraction(spans, 2) == pytest.approx(7.5 / 5 / 2)
    assert trace_figures(spans, 2)["run_entries_per_hour"] == pytest.approx(2 / 5 * 3600)  # s3, s4 in 5 s
    assert steady_window(spans, 4) is None and busy_fraction(spans, 4) is None  # no episode beyond the slots


def test_busy_fraction_is_one_when_every_slot_always_has_a_call() -> None:
    spans = [CallSpan(f"s{i}", float(i // 2) * 2, float(i // 2) * 2 + 2, 1) for i in range(8)]
    assert busy_fraction(spans, 2) == pytest.approx(1.0)


def _answers(renderer, text: str) -> PolicyAnswers:
    return PolicyAnswers(renderer.tokenizer, lambda session_id, n, prompt: text, renderer.eos_token_ids[0])


async def test_simulated_backend_takes_per_token_time_and_traces_concurrent_calls(renderer) -> None:
    backend = SimulatedBackend(
        _answers(renderer, "one two three four five six seven eight"), per_token_s=0.02
    )
    prompt = renderer.tokenizer.encode("Say something.", add_special_tokens=False)
    gens = await asyncio.gather(
        *(backend.generate(prompt, SamplingParams(), session_id=f"s{i}") for i in range(3))
    )
    n = len(gens[0].token_ids)
    assert gens[0].token_ids[-1] == renderer.eos_token_ids[0] and gens[0].logprobs == [-0.5] * n
    assert [s.session_id for s in backend.trace] == ["s0", "s1", "s2"] and {
        s.tokens for s in backend.trace
    } == {n}
    assert all(s.end - s.start >= n * 0.02 for s in backend.trace)  # asyncio.sleep never wakes early
    assert max(s.start for s in backend.trace) < min(
        s.end for s in backend.trace
    )  # all three in flight at once
    cut = await backend.generate(prompt, SamplingParams(max_tokens=2), session_id="s0")
    assert len(cut.token_ids) == 2 and cut.finish_reason == "length" and backend.trace[-1].tokens == 2


async def test_a_cancelled_call_is_traced_up_to_its_cancellation(renderer) -> None:
    backend = SimulatedBackend(_answers(renderer, "a long answer " * 20), per_token_s=1.0)
    prompt = renderer.tokenizer.encode("Say something.", add_special_tokens=False)
    call = asyncio.create_task(backend.generate(prompt, SamplingParams(), session_id="s"))
    await asyncio.sleep(0.05)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert len(backend.trace) == 1 and backend.trace[0].end - backend.trace[0].start < 10


def test_gold_steps_makes_four_tool_calls_then_answers(renderer) -> None:
    tasks = load_tasks("bundled")
    task = tasks[0]
    policy = make_policy("gold-steps", tasks)
    prompt = '{"name": "bash", "parameters": {"command": "string"}}\n' + task.problem_statement
    answers = [policy(f"{task.instance_id}.s0.a0", n, prompt) for n in range(5)]
    calls = [json.loads(a.split("<tool_call>\n", 1)[1].split("\n</tool_call>")[0]) for a in answers[:4]]
    assert [c["name"] for c in calls] == ["bash"] * 4 and "<tool_call>" not in answers[4]
    assert "git apply" in calls[2]["arguments"]["command"] and task.patch in calls[2]["arguments"]["command"]
    assert "py_compile" in calls[3]["arguments"]["command"]
    lengths = [len(renderer.tokenizer.encode(a, add_special_tokens=False)) for a in answers]
    assert all(20 <= n <= 400 for n in lengths), lengths


def _driver(name: str, eph: float) -> dict:
    return {
        "driver": name,
        "run_slots": 4,
        "episodes": 20,
        "wall_s": 100.0,
        "episodes_per_hour": eph,
        "status": {"completed": 20},
        "resolved": 20,
        "busy_fraction": 0.5,
        "steady_window_s": 60.0,
        "run_entries_per_hour": eph * 1.25,
        "mean_calls_in_flight": 2.0,
        "backend_calls": 100,
        "tokens_per_call": 90.0,
        "seconds_per_call": 1.8,
        "stages_mean_s": {"model_s": 9.0, "grade_s": 3.0},
        "episode_s": 17.0,
        "machine_cpu_busy": 0.6,
        "before_first_call_s": 2.0,
        "after_last_call_s": 9.0,
        "load_avg_before": [1.0, 1.0, 1.0],
        "load_avg_after": [3.0, 2.0, 1.0],
        "accepted_work": {
            "episodes": 20,
            "accepted_episodes": 18,
            "accepted_trainable_tokens": 9000,
            "accepted_tokens_per_hour": eph * 450,
            "accepted_tokens_per_run_slot_hour": eph * 112.5,
            "drop_fraction": 0.1,
            "stale_fraction": None,
        },
    }


def test_an_only_run_replaces_its_families_and_keeps_the_others() -> None:
    from bench.bench_cli import KEYS, merge_families
    from bench.report import render

    previous = {
        "command": "polar bench",
        "machine": {"cpus": 2},
        "families": {"builder": {"calls": 200, "runs": 1, "sizes": {}}},
        "errors": {"pipeline": "Boom"},
        "notes": {"pipeline": "skipped"},
        "seconds": {"builder": 3.0},
        "keys": dict.fromkeys(KEYS),
    }
    pipeline = {
        "harness": "pi",
        "policy": "gold-steps",
        "tasks": 5,
        "samples": 4,
        "run_slots": 4,
        "per_token_s": 0.02,
        "cores": 2,
        "order": ["staged", "collapsed"],
        "episodes_per_hour_ratio": 2.0,
        "drivers": {"staged": _driver("staged", 800.0), "collapsed": _driver("collapsed", 400.0)},
    }
    new = {
        "command": "polar bench --only pipeline",
        "finished_at": 0.0,
        "total_seconds": 200.0,
        "machine": {"load_avg_1_5_15": [1.0, 1.0, 1.0]},
        "families": {"pipeline": pipeline},
        "errors": {},
        "notes": {"builder": "not selected (--only)"},
        "seconds": {"pipeline": 199.0},
    }
    merged = merge_families(previous, new, {"pipeline"})
    assert (
        set(merged["families"]) == {"builder", "pipeline"}
        and merged["errors"] == {}
        and merged["notes"] == {}
    )
    assert merged["seconds"] == {"builder": 3.0, "pipeline": 199.0} and merged["command"] == "polar bench"
    assert (
        merged["keys"]["pipeline_episodes_per_hour_ratio"] == 2.0
        and merged["keys"]["pipeline_busy_fraction_staged"] == 0.5
    )
    assert merged["updates"][0]["families"] == ["pipeline"]
    again = merge_families(merged, new, {"pipeline"})  # a second run of the family replaces the first's entry
    assert [u["families"] for u in again["updates"]] == [["pipeline"]]
    text = render(merged)
    assert (
        "| inference busy fraction, staged driver, run slots 4 (`pipeline_busy_fraction_staged`) | 0.50 | "
        "> 0.90 | missed by 1.8x" in text
    )
    assert (
        "| staged | 20 | 100.0 | 800 | 0.50 |" in text
        and "`pipeline`: replaced by `polar bench --only pipeline`" in text
    )
    # the whole job's ratio against the steady state's: 100 calls x 1.8 s / 4 slots = 45 s of a 100 s wall
    assert "staged / collapsed: 2.00 over the whole job" in text and "takes 45.0 s at full run slots" in text
    assert "55.0 s of a 20-episode job" in text and "run-stage entries/hour, 2.00" in text
    # the accepted-work figure: a table row per driver, and its headline key per driver
    assert "| staged | 18 of 20 | 9,000 | 360,000 | 90,000 | 0.10 | null |" in text
    assert merged["keys"]["pipeline_accepted_tokens_per_run_slot_hour_collapsed"] == 45000.0

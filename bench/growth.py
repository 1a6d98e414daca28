"""Per-call cost against episode length: one long session with a fixed amount appended per turn.

The cost is measured as the proxy process's CPU time per call (exact, from schedstat), which a
loaded machine does not distort, next to the end-to-end added latency (which it does).

A proxy that re-renders the whole conversation pays O(history) tokenization per call (O(n²) per
episode). Polar renders only the appended messages, so its tokenization cost should be flat;
what still grows with history is unavoidable byte handling (parsing the resent JSON history,
sending the prompt ids to the backend), which the end-to-end figure includes. The ratio's two ends
are measured in turn, call for call, so a machine whose other load comes and goes weighs on both.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import cpu_seconds, filler, median
from bench.paths import Conversation, PathSet, run_conversation

CHECKPOINTS = (10, 50, 200)
HALF = 3  # a turn's figure is the median of the calls from 3 before it to 3 after
# the proxy's work after a call's answer went out (freeing the request) is done before the CPU is read,
# so it counts for its own call, not for the next (in turn: the other session's)
SETTLE_S = 0.005


def _window(values: list[float], turn: int, half: int = HALF) -> list[float]:
    return values[max(1, turn - half) : turn + half + 1]


def _ledger_calls(ledger: Path) -> list[list[tuple[float, int]]]:
    """Per session, per call: ``render_ms`` (matching + tokenizing, the part that must not grow)
    and the prompt length in tokens."""
    out = []
    for calls in ledger.glob("sessions/*/calls.jsonl"):
        rows = [json.loads(line) for line in calls.read_text().splitlines() if line.strip()]
        rows.sort(key=lambda r: r["call_index"])
        out.append(
            [
                (r["timings"].get("render_ms", 0.0), r.get("prompt_len", len(r.get("prompt_ids", []))))
                for r in rows
            ]
        )
    return out


async def measure(
    paths: PathSet, ledger: Path, *, runs: int, append_words: int = 150, turns: int = CHECKPOINTS[-1]
) -> dict[str, Any]:
    """Added latency (Polar - direct), Polar's render time and its CPU per call at turns 10, 50 and
    200; ``ledger`` is the Polar proxy's data directory (only the long sessions have ``turns`` calls).

    The CPU ratio's two ends are measured side by side, so the machine's other load weighs on both
    alike: each run drives one long session to turn ``turns`` + 3 and, over its last 14 calls, a
    fresh session's calls 0-13, call for call in turn with it (the fresh one's turn 10 beside the
    long one's turn ``turns``); each end is the median of its 7 calls around the turn, the ratio the
    median over runs of each run's ratio. A call's CPU is read ``SETTLE_S`` after its answer."""
    early, late = CHECKPOINTS[0], CHECKPOINTS[-1]
    direct, polar = paths.paths[0], paths.paths[1]
    history = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": filler(append_words, 7)},
    ]
    added: dict[int, list[float]] = {t: [] for t in CHECKPOINTS}
    polar_ms: dict[int, list[float]] = {t: [] for t in CHECKPOINTS}
    cpu_ms: dict[int, list[float]] = {t: [] for t in CHECKPOINTS}
    own_early: list[float] = []  # the long session's own turn 10, measured ~190 calls before its turn 200
    ratios: list[float] = []
    pid = paths.procs[1].proc.pid
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        for run in range(runs):

            def append(i: int, run: int = run) -> dict[str, str]:
                return {"role": "user", "content": filler(append_words, 1000 * run + i)}

            def append_fresh(i: int, run: int = run) -> dict[str, str]:
                return {"role": "user", "content": filler(append_words, 1000 * run + 500 + i)}

            lat_d = await run_conversation(http, direct, history, turns + HALF, append)
            long, fresh = (
                Conversation(http, polar, history, append),
                Conversation(http, polar, history, append_fresh),
            )
            clock = [cpu_seconds(pid)]

            async def cpu_since(clock: list[float] = clock) -> float:
                await asyncio.sleep(SETTLE_S)
                now = cpu_seconds(pid)
                spent, clock[0] = (now - clock[0]) * 1e3, now
                return spent

            lat_p: list[float] = []
            cpu_long: list[float] = []
            cpu_fresh: list[float] = []
            for i in range(turns + HALF + 1):
                if (
                    i >= late - early and fresh.calls <= early + HALF
                ):  # the fresh call j beside the long call 190 + j
                    await fresh.call()
                    cpu_fresh.append(await cpu_since())
                lat_p.append(await long.call())
                cpu_long.append(await cpu_since())
            for t in CHECKPOINTS:
                d, p = median(_window(lat_d, t)), median(_window(lat_p, t))
                added[t].append(p - d)
                polar_ms[t].append(p)
            cpu_ms[early].append(median(_window(cpu_fresh, early)))
            cpu_ms[CHECKPOINTS[1]].append(median(_window(cpu_long, CHECKPOINTS[1])))
            cpu_ms[late].append(median(_window(cpu_long, late)))
            own_early.append(median(_window(cpu_long, early)))
            ratios.append(cpu_ms[late][-1] / cpu_ms[early][-1])
    sessions = [calls for calls in _ledger_calls(ledger) if len(calls) > turns]
    render_at = {
        t: median([median([ms for ms, _ in _window(calls, t)]) for calls in sessions]) for t in CHECKPOINTS
    }
    result: dict[str, Any] = {
        "append_words": append_words,
        "runs": runs,
        "turns": turns,
        "interleaved": True,
        "settle_ms": SETTLE_S * 1e3,
    }
    for t in CHECKPOINTS:
        result[f"added_ms_turn{t}"] = median(added[t])
        result[f"polar_ms_turn{t}"] = median(polar_ms[t])
        result[f"render_ms_turn{t}"] = render_at[t]
        result[f"cpu_ms_turn{t}"] = median(cpu_ms[t])
        result[f"cpu_ms_turn{t}_runs"] = [round(v, 3) for v in cpu_ms[t]]
        result[f"prompt_tokens_turn{t}"] = sessions[0][t][1]
    result["cpu_ms_turn10_own_session"] = median(own_early)
    result["ratio_cpu_turn200_vs_turn10"] = median(ratios)
    result["ratio_cpu_runs"] = [round(r, 3) for r in ratios]
    first, last = result["added_ms_turn10"], result[f"added_ms_turn{late}"]
    result["ratio_added_turn200_vs_turn10"] = last / first if first > 0 else None
    r10, r200 = render_at[10], render_at[late]
    result["ratio_render_turn200_vs_turn10"] = r200 / r10 if r10 > 0 else None
    return result

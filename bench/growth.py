"""Per-call cost against episode length: one long session with a fixed amount appended per turn.

The cost is measured as the proxy process's CPU time per call (exact, from schedstat), which a
loaded machine does not distort, next to the end-to-end added latency (which it does).

A proxy that re-renders the whole conversation pays O(history) tokenization per call (O(n²) per
episode). Polar renders only the appended messages, so its tokenization cost should be flat;
what still grows with history is unavoidable byte handling (parsing the resent JSON history,
sending the prompt ids to the backend), which the end-to-end figure includes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import cpu_seconds, filler, median
from bench.paths import PathSet, run_conversation

CHECKPOINTS = (10, 50, 200)


def _window(values: list[float], turn: int, half: int = 3) -> list[float]:
    return values[max(1, turn - half): turn + half + 1]


def _ledger_calls(ledger: Path) -> list[list[tuple[float, int]]]:
    """Per session, per call: ``render_ms`` (matching + tokenizing, the part that must not grow)
    and the prompt length in tokens."""
    out = []
    for calls in ledger.glob("sessions/*/calls.jsonl"):
        rows = [json.loads(line) for line in calls.read_text().splitlines() if line.strip()]
        rows.sort(key=lambda r: r["call_index"])
        out.append([(r["timings"].get("render_ms", 0.0), r.get("prompt_len", len(r.get("prompt_ids", [])))) for r in rows])
    return out


async def measure(paths: PathSet, ledger: Path, *, runs: int, append_words: int = 150,
                  turns: int = CHECKPOINTS[-1]) -> dict[str, Any]:
    """Added latency (Polar - direct) and Polar's render time at turns 10, 50 and 200; ``ledger``
    is the Polar proxy's data directory (only this benchmark's sessions have ``turns`` calls)."""
    direct, polar = paths.paths[0], paths.paths[1]
    history = [{"role": "system", "content": "You are a careful coding agent."},
               {"role": "user", "content": filler(append_words, 7)}]
    added: dict[int, list[float]] = {t: [] for t in CHECKPOINTS}
    polar_ms: dict[int, list[float]] = {t: [] for t in CHECKPOINTS}
    cpu_ms: dict[int, list[float]] = {t: [] for t in CHECKPOINTS}
    pid = paths.procs[1].proc.pid
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        for run in range(runs):
            def append(i: int, run: int = run) -> dict[str, str]:
                return {"role": "user", "content": filler(append_words, 1000 * run + i)}

            lat_d = await run_conversation(http, direct, history, turns, append)
            clock = [cpu_seconds(pid)]
            per_call: list[float] = []

            def tick(clock: list[float] = clock, per_call: list[float] = per_call) -> None:
                now = cpu_seconds(pid)
                per_call.append((now - clock[0]) * 1e3)
                clock[0] = now

            lat_p = await run_conversation(http, polar, history, turns, append, after_each=tick)
            for t in CHECKPOINTS:
                d, p = median(_window(lat_d, t)), median(_window(lat_p, t))
                added[t].append(p - d)
                polar_ms[t].append(p)
                cpu_ms[t].append(median(_window(per_call, t)))
    sessions = [calls for calls in _ledger_calls(ledger) if len(calls) > turns]
    render_at = {t: median([median([ms for ms, _ in _window(calls, t)]) for calls in sessions])
                 for t in CHECKPOINTS}
    result: dict[str, Any] = {"append_words": append_words, "runs": runs, "turns": turns}
    for t in CHECKPOINTS:
        result[f"added_ms_turn{t}"] = median(added[t])
        result[f"polar_ms_turn{t}"] = median(polar_ms[t])
        result[f"render_ms_turn{t}"] = render_at[t]
        result[f"cpu_ms_turn{t}"] = median(cpu_ms[t])
        result[f"prompt_tokens_turn{t}"] = sessions[0][t][1]
    first, last = result["cpu_ms_turn10"], result[f"cpu_ms_turn{CHECKPOINTS[-1]}"]
    result["ratio_cpu_turn200_vs_turn10"] = last / first if first > 0 else None
    first, last = result["added_ms_turn10"], result[f"added_ms_turn{CHECKPOINTS[-1]}"]
    result["ratio_added_turn200_vs_turn10"] = last / first if first > 0 else None
    r10, r200 = render_at[10], render_at[CHECKPOINTS[-1]]
    result["ratio_render_turn200_vs_turn10"] = r200 / r10 if r10 > 0 else None
    return result

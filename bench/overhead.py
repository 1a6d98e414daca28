"""Added latency per call: the same conversations direct, through Polar and through LiteLLM.

Every path talks HTTP to the same backend process, so "added" = path latency - direct latency
measured in the same run. Runs interleave the paths so background load hits them alike; each
figure is the median over runs of that run's p50 / p99 (warm calls; the cold first call of a
conversation, which Polar must render whole, is reported apart).
"""

from __future__ import annotations

from typing import Any

import aiohttp

from bench.common import build_history, cpu_seconds, filler, median, percentile, rendered_tokens
from bench.paths import PathSet, run_conversation


def _append(words: int, seed: int):
    return lambda i: {"role": "user", "content": filler(words, seed * 1000 + i)}


def _cpu_clocks(paths: PathSet) -> dict[str, Any]:
    """Per proxy path, a function giving the CPU seconds its process tree used so far."""
    pids = {"polar": paths.procs[1].proc.pid}
    if paths.litellm is not None:
        pids["litellm"] = paths.litellm.pid
    return {name: (lambda pid=pid: cpu_seconds(pid)) for name, pid in pids.items()}


async def measure(
    renderer: Any,
    paths: PathSet,
    *,
    sizes: list[int],
    calls: int,
    runs: int,
    max_tokens: int = 64,
    append_words: int = 70,
) -> dict[str, Any]:
    """Per size: each path's p50/p99 and the added latency of Polar and LiteLLM over direct."""
    result: dict[str, Any] = {"litellm_error": paths.litellm_error, "sizes": {}}
    clocks = _cpu_clocks(paths)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        for size in sizes:
            history = build_history(renderer, size, seed=size)
            per_path: dict[str, dict[str, list[float]]] = {
                p.name: {"p50": [], "p99": [], "cold": [], "cpu_ms_per_call": []} for p in paths.paths
            }
            # one untimed conversation per path warms connections and caches
            for path in paths.paths:
                await run_conversation(
                    http, path, history, 1, _append(append_words, 0), max_tokens=max_tokens
                )
            for run in range(runs):
                for path in paths.paths:
                    clock = clocks.get(path.name)
                    cpu0 = [0.0]

                    def mark(clock=clock, cpu0=cpu0) -> None:
                        cpu0[0] = clock() if clock else 0.0

                    lat = await run_conversation(
                        http,
                        path,
                        history,
                        calls,
                        _append(append_words, run + 1),
                        max_tokens=max_tokens,
                        after_first=mark,
                    )
                    cpu = (clock() - cpu0[0]) * 1e3 / calls if clock else 0.0
                    per_path[path.name]["cpu_ms_per_call"].append(cpu)
                    warm = lat[1:]
                    per_path[path.name]["p50"].append(percentile(warm, 50))
                    per_path[path.name]["p99"].append(percentile(warm, 99))
                    per_path[path.name]["cold"].append(lat[0])
            entry: dict[str, Any] = {
                "tokens": rendered_tokens(renderer, history),
                "calls_per_run": calls,
                "runs": runs,
                "paths": {},
            }
            for name, stats in per_path.items():
                entry["paths"][name] = {k: median(v) for k, v in stats.items()}
            for name in per_path:
                if name == "direct":
                    continue
                entry[f"added_p50_ms_{name}"] = median(
                    [a - d for a, d in zip(per_path[name]["p50"], per_path["direct"]["p50"], strict=True)]
                )
                entry[f"added_p99_ms_{name}"] = median(
                    [a - d for a, d in zip(per_path[name]["p99"], per_path["direct"]["p99"], strict=True)]
                )
                entry[f"added_cold_ms_{name}"] = median(
                    [a - d for a, d in zip(per_path[name]["cold"], per_path["direct"]["cold"], strict=True)]
                )
            if "litellm" in per_path:
                lite = entry["added_p50_ms_litellm"]
                entry["ratio_p50_polar_vs_litellm"] = entry["added_p50_ms_polar"] / lite if lite > 0 else None
            result["sizes"][str(size)] = entry
    return result

"""docs/benchmarks.md from the results of `polar bench` (figures, targets, and what they mean)."""

from __future__ import annotations

import math
import time
from typing import Any

TARGETS = (  # key, label, target, "<" (lower is better) or ">" -- issue 14's targets first
    ("overhead_p50_ms_16k", "added latency p50, 16k tokens, instant backend (ms)", 2.0, "<"),
    ("ratio_polar_litellm_2k", "added p50, Polar / LiteLLM, 2k tokens", 0.3, "<"),
    ("ratio_polar_litellm_16k", "added p50, Polar / LiteLLM, 16k tokens", 0.3, "<"),
    ("ratio_polar_litellm_64k", "added p50, Polar / LiteLLM, 64k tokens", 0.3, "<"),
    ("ratio_polar_litellm_128k", "added p50, Polar / LiteLLM, 128k tokens", 0.3, "<"),
    ("per_call_ratio_turn200_vs_turn10", "per-call proxy CPU, turn 200 / turn 10", 1.5, "<="),
    ("calls_per_s_256_sessions", "calls/s, one process, 256 sessions (0 errors)", 2000.0, ">"),
    ("build_export_ms_100k", "build + export, 200 calls / 100k tokens (ms)", 50.0, "<"),
    ("export_json_ms_100k", "export JSON serialisation, 100k tokens (ms)", 100.0, "<"),
    # issue 29's targets
    ("proxy_cpu_ms_per_call_2k", "proxy CPU per call, 2k tokens, instant backend (ms)", 1.5, "<="),
    ("proxy_cpu_ms_per_call_16k", "proxy CPU per call, 16k tokens, instant backend (ms)", 2.0, "<="),
    (
        "calls_per_s_256_sessions",
        "calls/s, one process, 256 sessions (0 errors), issue 29's bar",
        1000.0,
        ">",
    ),
    # issue 31's targets
    ("pipeline_busy_fraction_staged", "inference busy fraction, staged driver, run slots 4", 0.9, ">"),
    ("pipeline_episodes_per_hour_ratio", "episodes/hour, staged / collapsed driver, run slots 4", 1.5, ">"),
)
# figures the issue asks to state, without a numeric target
STATED = (
    ("overhead_p99_ms_16k", "added latency p99, 16k tokens, instant backend (ms)"),
    ("overhead_p50_ms_16k_litellm", "LiteLLM's added latency p50, 16k tokens (ms)"),
    ("ledger_bytes_per_token", "ledger bytes per token of a 100k-token episode"),
    ("proxy_rss_mb_1024_sessions", "proxy RSS at 1,024 open sessions (MB)"),
    (
        "calls_per_s_256_sessions_workers_2",
        "calls/s, `polar proxy serve --workers 2`, 256 sessions (0 errors)",
    ),
    ("pipeline_busy_fraction_collapsed", "inference busy fraction, collapsed driver, run slots 4"),
    (
        "pipeline_accepted_tokens_per_run_slot_hour_staged",
        "accepted trainable tokens per run-slot hour, staged driver, run slots 4",
    ),
    (
        "pipeline_accepted_tokens_per_run_slot_hour_collapsed",
        "accepted trainable tokens per run-slot hour, collapsed driver, run slots 4",
    ),
)


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def verdict(value: float | None, target: float, direction: str) -> str:
    if value is None:
        return "not measured"
    if direction in ("<", "<="):
        met = value < target or (direction == "<=" and value == target)
        return "met" if met else f"missed by {value / target:.1f}x ({_f(value)} vs {direction} {_f(target)})"
    return (
        "met"
        if value >= target
        else f"missed by {target / value:.1f}x ({_f(value)} vs >= {_f(target)})"
        if value > 0
        else "missed (0)"
    )


def _overhead(section: dict[str, Any], title: str) -> list[str]:
    lines = [
        f"### {title}",
        "",
        (
            "| conversation | path | p50 ms | p99 ms | cold call ms | proxy CPU ms/call | added p50 ms | "
            "added p99 ms |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for entry in section.get("sizes", {}).values():
        for name, stats in entry["paths"].items():
            added50 = entry.get(f"added_p50_ms_{name}")
            added99 = entry.get(f"added_p99_ms_{name}")
            cpu = stats.get("cpu_ms_per_call") if name != "direct" else None
            lines.append(
                f"| {entry['tokens']:,} tokens | {name} | {_f(stats['p50'])} | {_f(stats['p99'])} | "
                f"{_f(stats['cold'])} | {_f(cpu)} | {_f(added50)} | {_f(added99)} |"
            )
    lines.append("")
    ratios = [
        f"{e['tokens']:,} tokens: {_f(e.get('ratio_p50_polar_vs_litellm'))}"
        for e in section.get("sizes", {}).values()
        if "ratio_p50_polar_vs_litellm" in e
    ]
    if ratios:
        lines += ["Added p50, Polar / LiteLLM (below 1 = Polar cheaper): " + "; ".join(ratios) + ".", ""]
    cpu_ratio = []
    for e in section.get("sizes", {}).values():
        p, q = (
            e["paths"].get("polar", {}).get("cpu_ms_per_call"),
            e["paths"].get("litellm", {}).get("cpu_ms_per_call"),
        )
        if p and q:
            cpu_ratio.append(f"{e['tokens']:,} tokens: {p / q:.2f}")
    if cpu_ratio:
        lines += ["Proxy CPU per call, Polar / LiteLLM: " + "; ".join(cpu_ratio) + ".", ""]
    if section.get("litellm_error"):
        lines += [f"LiteLLM was not measured: {section['litellm_error']}", ""]
    return lines


def _local_note(section: dict[str, Any]) -> list[str]:
    """With a real model, wall-clock 'added' figures are the model's variance; say what is not."""
    notes = []
    for e in section.get("sizes", {}).values():
        direct = e["paths"]["direct"]["p50"]
        for name in ("polar", "litellm"):
            cpu = e["paths"].get(name, {}).get("cpu_ms_per_call")
            if cpu is not None and direct > 0:
                notes.append(
                    f"{name}'s proxy CPU per call is {100 * cpu / direct:.3f}% of the direct call's "
                    f"p50 ({_f(cpu)} ms of {direct / 1000:.1f} s)"
                )
    return [
        "With a real model on a loaded 2-core machine, the added columns are dominated by the "
        "model's own run-to-run variance (they can even come out negative): they are not proxy cost. "
        "The proxy cost is the CPU column: " + "; ".join(notes) + ".",
        "",
    ]


def _workspace(fam: dict[str, Any]) -> list[str]:
    from bench.workspace import BEFORE, BEFORE_COMMIT, BEFORE_LOAD, COMMAND

    start, end = fam["load_avg_1"]
    out = [
        "## Workspace creation",
        "",
        f"`{COMMAND}` (or `polar bench --only workspace`): `open_workspace` + `close` of a bubblewrap "
        f"workspace, {fam['runs']} times per bundled task after a first open (which builds the task's warm "
        f"base on this node, `first s`), at a 1-minute load of {start}-{end}. Before warm bases "
        f"({BEFORE_COMMIT}: every episode unpacked, committed, copied and snapshotted its tree) the same "
        f"command gave the `before` column, at a load of {BEFORE_LOAD}.",
        "",
        "| bundled task | before median s | median s | p90 s | first s | clone |",
        "|---|---|---|---|---|---|",
    ]
    for task, v in fam["tasks"].items():
        out.append(
            f"| {task} | {_f(BEFORE.get(task))} | {_f(v['median_s'])} | {_f(v['p90_s'])} | "
            f"{_f(v['first_s'])} | {v['clone']} |"
        )
    return [*out, "", *_container_workspaces(fam.get("containers") or {})]


def _container_workspaces(fam: dict[str, Any]) -> list[str]:
    from bench.workspace import CONTAINER_BEFORE, CONTAINER_BEFORE_COMMIT, CONTAINER_BEFORE_LOAD

    if not fam.get("tasks"):
        return [f"Container workspaces: {fam.get('skipped', 'not measured')}.", ""]
    start, end = fam["load_avg_1"]
    out = [
        f"The same in {fam['engine']}, the bundled tasks with an image recipe as image rows: a container of "
        "the task's warm image (`sandbox/warm_images.py`: its tree handed to the sandbox uid and snapshotted "
        "once per node and image, committed; `first s` includes the commit), at a 1-minute load of "
        f"{start}-{end}. Before warm images ({CONTAINER_BEFORE_COMMIT}: every episode's container re-owned "
        "its whole tree and snapshotted it with git, as root) the same command gave the `before` column, "
        f"at a load of {CONTAINER_BEFORE_LOAD}.",
        "",
        "| image row | before median s | median s | p90 s | first s | clone |",
        "|---|---|---|---|---|---|",
    ]
    for task, v in fam["tasks"].items():
        out.append(
            f"| {task} | {_f(CONTAINER_BEFORE.get(task))} | {_f(v['median_s'])} | {_f(v['p90_s'])} | "
            f"{_f(v['first_s'])} | {v['clone']} |"
        )
    return [*out, ""]


def render(results: dict[str, Any]) -> str:
    fam, keys, m = results["families"], results.get("keys", {}), results["machine"]
    out = [
        "# Benchmarks",
        "",
        f"Produced by `{results['command']}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(results.get('finished_at', time.time())))} "
        f"in {results.get('total_seconds')} s. Regenerate with the same command; `--json FILE` writes "
        "the same figures machine-readably.",
        "",
        "## Machine",
        "",
        f"- CPU: {m.get('cpu', '?')}, {m.get('cpus')} cores; memory {m.get('mem_gb')} GB; "
        f"Python {m.get('python')}; {m.get('platform')}",
        "- Load average (1/5/15 min) at start: "
        f"{', '.join(f'{x:.1f}' for x in m.get('load_avg_1_5_15', []))}; "
        f"at end: {', '.join(f'{x:.1f}' for x in m.get('load_avg_1_5_15_end', []))}. The machine was shared "
        "with other jobs during the run, so wall-clock figures are pessimistic: the CPU-time figures "
        "(proxy CPU ms per call) are the ones least affected by that load."
        + (f" During this run: {m['note']}" if m.get("note") else ""),
        "- Every figure is the median over the repeated runs listed with it; latencies are measured by "
        "the client around one HTTP call whose body was encoded before the clock started.",
        "",
        *_updates(results),
        "## Targets",
        "",
        "| figure | value | target | verdict |",
        "|---|---|---|---|",
    ]
    for key, label, target, direction in TARGETS:
        out.append(
            f"| {label} (`{key}`) | {_f(keys.get(key))} | {direction} {_f(target)} | "
            f"{verdict(keys.get(key), target, direction)} |"
        )
    for key, label in STATED:
        out.append(f"| {label} (`{key}`) | {_f(keys.get(key))} | stated | - |")
    out.append("")
    if "overhead_instant" in fam:
        out += [
            "## Overhead per call",
            "",
            "Three paths, one backend process: (a) **direct** to the backend's `/v1/chat/completions`; "
            "(b) **polar**: Polar's proxy (own process, `vllm` backend kind) which sends the prompt as "
            "token ids to the same backend's vLLM-style `/v1/completions` (sampled ids come back as "
            "`token_id:N` logprob tokens, the prompt is not echoed, as with vLLM); (c) **litellm**: "
            "LiteLLM's proxy server (`litellm --config`, own process, one worker, master key set) passing "
            "the chat request through to the same backend. Added = path minus direct, per run, then the "
            "median over runs. Each conversation: a cold first call on the history, then calls that each "
            "append the answer and a ~100-token user turn (what an agent loop does). The instant backend "
            "answers at once with a fixed completion, so the differences are proxy cost.",
            "",
        ]
        out += _overhead(fam["overhead_instant"], "Instant backend")
    if "overhead_local" in fam:
        out += _overhead(
            fam["overhead_local"], "Local model backend (SmolLM2-135M on CPU, greedy, 8 new tokens)"
        )
        out += _local_note(fam["overhead_local"])
    if "growth" in fam:
        g = fam["growth"]
        out += [
            "## Growth with episode length",
            "",
            f"One session, {g['turns']} turns, each appending the answer and a user turn of "
            f"{g['append_words']} words; {g['runs']} run(s); each figure is the median of the 7 calls "
            "around the turn. `proxy CPU ms` is the proxy process's CPU time per call (the per-call "
            "cost, and the `per_call_ratio_turn200_vs_turn10` key: wall-clock figures on a loaded "
            "machine mostly measure the scheduler); `render ms` is Polar's matching + tokenizing time "
            "from the ledger's timings; `added ms` is end to end, Polar minus direct.",
            "",
        ]
        if g.get("interleaved"):
            out += [
                "The CPU ratio's two ends are measured side by side, so the machine's other load weighs "
                "on both alike: over the long session's last 14 calls a fresh session makes its calls "
                "0-13, call for call in turn with it (its turn 10 beside the long one's turn 200); turn "
                "10's CPU is the fresh session's, the ratio is the median over the runs of each run's "
                f"ratio; a call's CPU is read {g['settle_ms']:.0f} ms after its answer, so the proxy's "
                "work after the answer counts for that call. Per run: "
                f"turn 10 {_runs(g['cpu_ms_turn10_runs'])} ms, "
                f"turn 200 {_runs(g['cpu_ms_turn200_runs'])} ms, "
                f"ratio {_runs(g['ratio_cpu_runs'])}; the long session's own turn 10, measured 190 calls "
                "before its turn 200: "
                f"{_f(g['cpu_ms_turn10_own_session'])} ms (median of runs).",
                "",
            ]
        out += [
            "| turn | prompt tokens | proxy CPU ms | render ms | Polar ms | added ms |",
            "|---|---|---|---|---|---|",
        ]
        for t in (10, 50, 200):
            out.append(
                f"| {t} | {g.get(f'prompt_tokens_turn{t}', 0):,} | {_f(g.get(f'cpu_ms_turn{t}'))} | "
                f"{_f(g[f'render_ms_turn{t}'])} | {_f(g[f'polar_ms_turn{t}'])} | "
                f"{_f(g[f'added_ms_turn{t}'])} |"
            )
        out += [
            "",
            f"Ratio turn 200 / turn 10: proxy CPU {_f(g.get('ratio_cpu_turn200_vs_turn10'))}, "
            f"render {_f(g['ratio_render_turn200_vs_turn10'])}, added latency "
            f"{_f(g['ratio_added_turn200_vs_turn10'])}.",
            "",
        ]
    if "concurrency" in fam:
        c = fam["concurrency"]
        out += [
            "## Concurrency",
            "",
            f"One Polar proxy process with the in-process instant backend; N sessions, each replaying a "
            f"{c['turns_per_conversation']}-turn conversation (then starting a new chain), measured over "
            f"{c['seconds']} s after a warm-up; calls/s is the median of the runs shown.",
            "",
            *_concurrency_table(c),
            "",
            f"Storage: {c['ledger_bytes'] / 2**20:.1f} MB of ledger for {c['record_tokens']:,} recorded "
            f"token ids ({_f(c['disk_bytes_per_record_token'])} bytes each; a call's line stores only what "
            f"it adds to its parent) and {c['chain_tokens']:,} distinct chain tokens "
            f"({_f(c['disk_bytes_per_chain_token'])} bytes each). RAM: proxy RSS went from "
            f"{c['rss_mb_idle']:.0f} MB idle to {_f(c['rss_mb_end'], 0)} MB, "
            f"{_f(c['ram_bytes_per_record_token'])} bytes per recorded token id "
            f"({_f(c['ram_bytes_per_chain_token'])} per chain token).",
            "",
        ]
    if "concurrency_workers" in fam:
        w = fam["concurrency_workers"]
        out += [
            f"### {w['workers']} proxy processes",
            "",
            f"The same load against `polar proxy serve --workers {w['workers']}`'s layout: an admin front "
            f"that assigns each session to one of {w['workers']} proxy processes, whose port the session's "
            "urls name (docs/proxy.md); CPU and RSS are the whole process tree's.",
            "",
            *_concurrency_table(w),
            "",
        ]
    if "builder" in fam:
        b = fam["builder"]
        out += [
            "## Builder and export",
            "",
            f"Synthetic records of one {b['calls']}-call chain (60 sampled tokens per call), written to a "
            "ledger as the proxy writes them and read back (`ledger read ms`: `Ledger.calls`, which "
            "rebuilds and hash-checks every prompt); `build` = `build_trajectory`, `export` = "
            "`to_nemo_gym_result(arrays=True)` + `grpo_rows` (as the agent server and `polar rollout` "
            "export); `json` = `jsonl_line` of each (orjson), as the exports write them; the NeMo result "
            "repeats each call's prompt (NeMo-RL's contract), so its size grows with calls x context; "
            f"median of {b['runs']} runs.",
            "",
            "| tokens | ledger bytes / token | ledger read ms | build ms | export ms | build + export ms "
            "| json ms | json MB |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for v in b["sizes"].values():
            out.append(
                f"| {v['sequence_tokens']:,} | {_f(v.get('ledger_bytes_per_token'))} | "
                f"{_f(v.get('ledger_read_ms'))} | {_f(v['build_ms'])} | {_f(v['export_ms'])} | "
                f"{_f(v['build_export_ms'])} | {_f(v['json_ms'])} | {_f(v['json_mb'])} |"
            )
        out.append("")
    if "shapes" in fam:
        out += _shapes(fam["shapes"])
    if "grading" in fam or "rollouts" in fam:
        out += ["## Grading and rollouts", ""]
    if "grading" in fam:
        out += ["| bundled task | grade s (gold patch) | env setup s (first use) |", "|---|---|---|"]
        for task, v in fam["grading"].items():
            out.append(f"| {task} | {_f(v['grade_s'])} | {_f(v['setup_s'])} |")
        out.append("")
    if "grading_loop" in fam:
        out += _grading_loop(fam["grading_loop"])
    if "rollouts" in fam:
        out += [
            "`polar rollout --policy gold --harness pi --tasks bundled --limit 2` (Pi in bubblewrap, "
            "scripted gold policy scored by the embedded model, graded); wall time includes the "
            "command's own start (imports, model load):",
            "",
            "| concurrency | episodes | wall s | rollouts/hour | resolved |",
            "|---|---|---|---|---|",
        ]
        for v in fam["rollouts"].values():
            out.append(
                f"| {v['concurrency']} | {v['episodes']} | {_f(v['wall_s'])} | "
                f"{_f(v['rollouts_per_hour'], 0)} | {v['resolved']} |"
            )
        out.append("")
    if "workspace" in fam:
        out += _workspace(fam["workspace"])
    if "pipeline" in fam:
        out += _pipeline(fam["pipeline"])
    for name in ("profile", "profile_2k"):
        if fam.get(name, {}).get("self"):
            out += _profile(fam[name])
    if fam.get("profile_growth", {}).get("growth"):
        out += _profile_growth(fam["profile_growth"])
    out.append(analysis(results))
    skipped = {**results.get("notes", {})}
    if skipped or results.get("errors"):
        out += ["## Not measured", ""]
        out += [f"- `{k}`: {v}" for k, v in skipped.items()]
        out += [
            f"- `{k}`: failed: `{v.strip().splitlines()[-1]}`" for k, v in results.get("errors", {}).items()
        ]
        out.append("")
    return "\n".join(out)


def _runs(values: list[float]) -> str:
    """Per-run figures and their spread, as the growth section gives them."""
    return f"{', '.join(f'{v:.2f}' for v in values)} (spread {min(values):.2f}-{max(values):.2f})"


def _profile(p: dict[str, Any]) -> list[str]:
    out = [
        f"## Profile of Polar's proxy (py-spy, {p['size'] // 1000}k-token conversation, instant backend)",
        "",
        f"{p['samples']} samples of the thread holding the interpreter lock (`py-spy --gil`) over "
        f"{p['calls']} calls (the first of them cold).",
        "",
        "| self % | frame |",
        "|---|---|",
    ]
    out += [f"| {r['percent']} | `{r['frame']}` |" for r in p["self"]]
    out += ["", "| inclusive % | Polar frame |", "|---|---|"]
    out += [f"| {r['percent']} | `{r['frame']}` |" for r in p["polar_inclusive"]]
    return [*out, ""]


def _profile_growth(p: dict[str, Any]) -> list[str]:
    (a, b), (c, d) = p["windows"]["early"], p["windows"]["late"]
    out = [
        f"## Profile of the growth (py-spy, one {p['turns']}-turn session, instant backend)",
        "",
        f"The proxy's CPU per call over calls {a}-{b} and {c}-{d} of one session built as the growth "
        f"family's (schedstat, with py-spy attached: {p['cpu_ms_early']:.2f} and {p['cpu_ms_late']:.2f} "
        f"ms), split by py-spy's samples of the interpreter-holding thread (`--gil`, {p['rate']} Hz, the "
        "loop's idle wait left out) into each frame's ms per call; the frames whose cost grew most with "
        "the history:",
        "",
        "| frame | early ms/call | late ms/call | grew by |",
        "|---|---|---|---|",
    ]
    out += [
        f"| `{r['frame']}` | {r['early_ms']:.3f} | {r['late_ms']:.3f} | {r['late_ms'] - r['early_ms']:.3f} |"
        for r in p["growth"]
    ]
    return [*out, ""]


def _updates(results: dict[str, Any]) -> list[str]:
    """Which families later ``--only`` runs replaced, when, and the machine's load then."""
    lines = []
    for u in results.get("updates", []):
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(u["finished_at"]))
        load = ", ".join(f"{x:.1f}" for x in u["machine"].get("load_avg_1_5_15", []))
        end = ", ".join(f"{x:.1f}" for x in u["machine"].get("load_avg_1_5_15_end", []))
        note = f" During it: {u['machine']['note']}" if u["machine"].get("note") else ""
        lines.append(
            f"- {', '.join(f'`{f}`' for f in u['families'])}: replaced by `{u['command']}` on {when} "
            f"in {u['total_seconds']} s (load average at start {load}, at end {end}).{note}"
        )
    return ["## Later runs of some families", "", *lines, ""] if lines else []


PIPELINE_STAGES = (
    ("queued_s", "queued"),
    ("prepare_s", "prepare (workspace, session)"),
    ("harness_start_s", "harness start"),
    ("wait_s", "wait for a run slot"),
    ("model_s", "model (backend calls)"),
    ("tool_s", "tools and harness between calls"),
    ("drain_s", "drain"),
    ("grade_s", "grade"),
    ("build_s", "trajectory build and export"),
)


def _shapes(s: dict[str, Any]) -> list[str]:
    return [
        "## Outgoing wire shapes",
        "",
        "One Chat Completions answer (reasoning, text, two tool calls, 60 tokens' logprobs) built and "
        "encoded as its body and its SSE chunks, three ways in one run (`bench/shapes.py`, median of "
        f"{s['runs']} runs of {s['answers_per_run']:,} answers): the proxy's msgspec shapes, the dict "
        "literals they replaced, and pydantic v2 models (the `openai` SDK's own types).",
        "",
        "| way | µs per answer | vs dict literals |",
        "|---|---|---|",
        (
            f"| msgspec shapes (shipped) | {_f(s['typed_shapes_us_per_answer'], 1)} | "
            f"{_f(s['typed_shapes_vs_dicts'])} |"
        ),
        f"| dict literals (before) | {_f(s['dict_literals_us_per_answer'], 1)} | 1.00 |",
        (
            f"| pydantic v2 models | {_f(s['pydantic_models_us_per_answer'], 1)} | "
            f"{_f(s['pydantic_models_vs_dicts'])} |"
        ),
        "",
    ]


def _grading_loop(g: dict[str, Any]) -> list[str]:
    out = [
        f"What grading costs the event loop that answers model calls: the {g['tasks']} bundled gold patches "
        f"graded {g['slots']} at a time through the rollout's `Grading` while the loop runs a 1 ms ticker "
        "(lateness of each tick; after a warm-up pass, so both see warm bases and the node's gold runs):",
        "",
        "| grades on | wall s | ticks | lag p50 ms | lag p99 ms | lag max ms | ticks late > 10 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in ("threads", "processes"):
        v = g[mode]
        out.append(
            f"| {mode} | {_f(v['wall_s'])} | {v['ticks']:,} | {_f(v['lag_p50_ms'])} | "
            f"{_f(v['lag_p99_ms'])} | {_f(v['lag_max_ms'])} | {_f(100 * v['late_10ms_fraction'])}% |"
        )
    return [*out, ""]


def _pipeline(p: dict[str, Any]) -> list[str]:
    drivers = p["drivers"]
    out = [
        "## Rollout pipeline",
        "",
        f"`rollout.runner.run_rollouts` twice in one run on the same episodes ({p['tasks']} bundled tasks x "
        f"{p['samples']} samples): {p['harness']} in bubblewrap, the `{p['policy']}` scripted policy (five "
        "calls: list the repository, read the code the patch changes, apply the gold patch, diff stat and "
        "compile check, final answer; answers of 50-300 tokens), graded by the real grader, at "
        f"{p['run_slots']} run slots; run in the order {' then '.join(p['order'])}. The backend "
        f"(`backends/simulated.py`) answers after {p['per_token_s'] * 1000:.0f} ms per answer token, an "
        "asyncio sleep that costs no CPU, as a GPU server's calls cost the rollout machine none. `collapsed` "
        "is the same driver with one slot held over prepare, run and grade (the driver before the stages); "
        "`staged` ran with "
        + ", ".join(
            f"{k.replace('_', ' ')} {drivers['staged'].get(k)}"
            for k in ("run_slots", "prepare_slots", "lookahead", "grade_slots")
        )
        + ".",
        "",
        "**Busy fraction** = the mean number of backend calls in flight / run slots over the steady state: "
        "from the moment the run-slots-th episode made its first model call (every slot has had an "
        "episode) to the moment the last episode made its first model call (after it no episode is left "
        "to fill a slot that frees). It counts the backend's time only: a run slot whose harness is "
        "running a tool is idle inference. Run-stage entries/hour: episodes that entered the run stage in "
        "the steady state per hour, the inference side's rate, which episodes/hour (wall time, warm-up and "
        "the last gradings included) follows only where grading keeps up.",
        "",
        "| driver | episodes | wall s | episodes/hour | busy fraction | calls in flight | steady window s "
        "| run-stage entries/hour (steady) | resolved | machine CPU busy | load avg 1 min before, after |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, d in drivers.items():
        out.append(
            f"| {name} | {d['episodes']} | {_f(d['wall_s'], 1)} | {_f(d['episodes_per_hour'], 0)} | "
            f"{_f(d['busy_fraction'])} | {_f(d['mean_calls_in_flight'])} | {_f(d['steady_window_s'], 1)} | "
            f"{_f(d.get('run_entries_per_hour'), 0)} | "
            f"{d['resolved']} | {100 * d['machine_cpu_busy']:.0f}% of {p['cores']} cores | "
            f"{d['load_avg_before'][0]:.1f}, {d['load_avg_after'][0]:.1f} |"
        )
    out += [
        "",
        f"Episodes/hour, staged / collapsed: {_f(p['episodes_per_hour_ratio'])}. Backend: "
        + "; ".join(
            f"{n} {d['backend_calls']} calls of {_f(d['tokens_per_call'], 0)} tokens, "
            f"{_f(d['seconds_per_call'])} s each"
            for n, d in drivers.items()
        )
        + ".",
        "",
        "Where an episode's time went (mean seconds, the trajectories' `timings`):",
        "",
        "| stage | " + " | ".join(drivers) + " |",
        "|---|" + "---|" * len(drivers),
    ]
    for key, label in PIPELINE_STAGES:
        out.append(
            f"| {label} | " + " | ".join(_f(d["stages_mean_s"].get(key)) for d in drivers.values()) + " |"
        )
    out.append("| whole episode | " + " | ".join(_f(d["episode_s"]) for d in drivers.values()) + " |")
    if all("accepted_work" in d for d in drivers.values()):
        out += [
            "",
            "**Accepted work** (summary.json's `accepted_work`, trajectory/accepted.py): trainable tokens of "
            "the episodes the trainer keeps (unmasked, in a group with two or more unmasked samples), per "
            "hour of the episodes' spans and per run slot; the dropped (masked or thin-group) and stale "
            "(sampled by an older policy than the newest) fractions beside it. The backend's GPUs are not "
            "known here (a simulated server), so there is no per-GPU-hour figure.",
            "",
            "| driver | accepted episodes | accepted tokens | accepted tokens/hour | per run-slot hour "
            "| drop fraction | stale fraction |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, d in drivers.items():
            w = d["accepted_work"]
            out.append(
                f"| {name} | {w['accepted_episodes']} of {w['episodes']} | "
                f"{w['accepted_trainable_tokens']:,} | {_f(w['accepted_tokens_per_hour'], 0)} | "
                f"{_f(w['accepted_tokens_per_run_slot_hour'], 0)} | {_f(w['drop_fraction'])} | "
                f"{_f(w['stale_fraction'])} |"
            )
    return [*out, "", *_pipeline_why(drivers), ""]


def _pipeline_why(drivers: dict[str, Any]) -> list[str]:
    """What bounds each driver's busy fraction, from its own stage split (the profile of a miss)."""
    lines = []
    for name, d in drivers.items():
        st = d["stages_mean_s"]
        model, tool = st.get("model_s"), st.get("tool_s")
        if model is None or tool is None or model + tool <= 0:
            continue
        if d.get("collapsed"):
            held = d["episode_s"]
            line = (
                f"- `{name}`: a slot is held {held:.1f} s per episode, {model:.1f} s of it in model calls, "
                f"so the backend is at most {model / held:.2f} busy per slot however the slots are fed "
                "(the slot is held over the whole episode: prepare, harness start, drain and grading too)."
            )
        else:
            wait = st.get("wait_s") or 0.0
            line = (
                f"- `{name}`: a run slot is held per model call, {model:.1f} s of an episode's run stage; "
                f"its other {tool:.1f} s (the harness's tools and its own work between calls, and its "
                "exit) leave the slot to another live harness's call. An episode spent "
                f"{_f(st.get('prepare_s'))} s preparing and {_f(st.get('harness_start_s'))} s booting its "
                f"harness, then its calls waited {wait:.2f} s for run slots in all: "
                + (
                    "live harnesses queued for full slots, as they should."
                    if wait >= 1
                    else "the slots waited for live harnesses instead (a larger --lookahead would feed them)."
                )
            )
        line += (
            f" Its wall time had {d['before_first_call_s']:.1f} s before the first model call and "
            f"{d['after_last_call_s']:.1f} s after the last (the last episodes' grading)."
        )
        lines.append(line)
    staged, collapsed = drivers.get("staged"), drivers.get("collapsed")
    needs = (
        "episodes_per_hour",
        "run_entries_per_hour",
        "busy_fraction",
        "wall_s",
        "backend_calls",
        "seconds_per_call",
        "run_slots",
        "episodes",
        "before_first_call_s",
    )
    if staged and collapsed and all(d.get(k) for d in (staged, collapsed) for k in needs):
        ideal = staged["backend_calls"] * staged["seconds_per_call"] / staged["run_slots"]
        lines.append(
            "- Episodes/hour, staged / collapsed: "
            f"{staged['episodes_per_hour'] / collapsed['episodes_per_hour']:.2f} "
            "over the whole job, warm-up and tail included. The staged driver's backend work alone takes "
            f"{ideal:.1f} s at full run slots ({staged['backend_calls']} calls x "
            f"{staged['seconds_per_call']:.2f} s / {staged['run_slots']}); its wall time was "
            f"{staged['wall_s']:.1f} s: {staged['wall_s'] - ideal:.1f} s of a "
            f"{staged['episodes']}-episode job is its start (first call at "
            f"{staged['before_first_call_s']:.1f} s), its tail (once fewer live episodes than run slots "
            "have calls left, slots idle) and the last gradings, a share that shrinks as a job grows. In "
            "the steady state the ratio is the run-stage entries/hour, "
            f"{staged['run_entries_per_hour'] / collapsed['run_entries_per_hour']:.2f}, bound by the busy "
            f"fractions' ratio ({staged['busy_fraction'] / collapsed['busy_fraction']:.2f}): the less of a "
            "collapsed slot's episode is not model time (grading, harness start), the less there is to win."
        )
    busy = max(d["machine_cpu_busy"] for d in drivers.values())
    if busy > 0.9:
        lines.append(
            f"- The machine's cores were {100 * busy:.0f}% busy (every job on it, this run's and others'; "
            "load averages in the table): the CPU-bound stages (the harness's start-up, grading, the "
            "harness's work between calls) stretched, and with them the run stage's non-model time. "
            "Episodes/hour is then bound by the CPU share the run got (grading and the harness's start-up "
            "are CPU work) more than by how the driver schedules, whichever driver runs."
        )
    return lines


def _fixed_cost(fam: dict[str, Any], keys: dict[str, Any]) -> str:
    """What the short conversation's CPU per call is made of, from its own profile."""
    cpu, prof = keys.get("proxy_cpu_ms_per_call_2k"), fam.get("profile_2k", {})
    if cpu is None or not prof.get("self"):
        return ""
    top = prof["self"][0]
    if cpu <= 1.5:
        return (
            f" At 2k tokens the {cpu:.2f} ms meets its target (<= 1.5); it is a call's fixed work, spread "
            "over aiohttp's server and client, orjson both ways, decoding the request, rendering and "
            f"tokenizing the appended turn, no frame above {top['percent']}% of the GIL's samples "
            f"(`{top['frame']}`)."
        )
    return (
        f" At 2k tokens the {cpu:.2f} ms (target <= 1.5) is a call's fixed work, not its history: the 2k "
        f"profile spreads it over aiohttp's server and client (the two HTTP exchanges), orjson both ways, "
        f"decoding the request and the backend call, no frame above {top['percent']}% of the samples "
        f"(`{top['frame']}`); what is left to take is Python frames per exchange, not a hot spot."
    )


def _slope(fam: dict[str, Any]) -> str:
    """Polar's proxy CPU per call against history length, from the growth run."""
    g = fam.get("growth")
    if not g or g.get("cpu_ms_turn10") is None:
        return ""
    t0, t1 = g["prompt_tokens_turn10"], g["prompt_tokens_turn200"]
    per_k = (g["cpu_ms_turn200"] - g["cpu_ms_turn10"]) / max(1, t1 - t0) * 1000
    return (
        f" In this run that is about {per_k:.2f} ms of proxy CPU per 1k tokens of history on top of "
        f"{g['cpu_ms_turn10'] - per_k * t0 / 1000:.1f} ms per call."
    )


GROWTH_FRAMES = {
    "loads": "the resent JSON body parsed",
    "dumps": "the prompt ids encoded for the backend",
    "common_prefix": "the resent messages compared with the previous request's",
    "_writelines": "the bytes written to the sockets",
    "data_received": "the bytes read from the sockets",
}


def _growth_frames(fam: dict[str, Any]) -> str:
    """The frames the growth profile says grew most, in words."""
    p = fam.get("profile_growth", {})
    if not p.get("growth"):
        return ""
    parts = []
    for r in p["growth"][:5]:
        name = r["frame"].split(" (")[0]
        what = GROWTH_FRAMES.get(name.rsplit(".", 1)[-1])
        parts.append(f"`{name}` +{r['late_ms'] - r['early_ms']:.2f} ms" + (f" ({what})" if what else ""))
    return (
        f" The growth profile (its table above; per call, with py-spy attached) puts the late calls' extra "
        f"CPU in: {'; '.join(parts)}."
    )


def _beside_litellm(fam: dict[str, Any]) -> str:
    """Polar's and LiteLLM's CPU per call against history length, from the overhead table's sizes."""
    sizes = sorted(fam.get("overhead_instant", {}).get("sizes", {}).values(), key=lambda e: e["tokens"])
    cpu = [
        (
            e["tokens"],
            e["paths"].get("polar", {}).get("cpu_ms_per_call"),
            e["paths"].get("litellm", {}).get("cpu_ms_per_call"),
        )
        for e in sizes
    ]
    cpu = [row for row in cpu if row[1] is not None and row[2] is not None]
    if len(cpu) < 2:
        return ""
    (t0, p0, l0), (t1, p1, l1) = cpu[0], cpu[-1]
    per_k = [(b - a) / (t1 - t0) * 1000 for a, b in ((p0, p1), (l0, l1))]
    return (
        f" Beside LiteLLM (the overhead table's CPU column, {t0:,} to {t1:,} tokens): Polar's CPU per call "
        f"grows by {per_k[0]:.3f} ms per 1k tokens of history ({p0:.2f} to {p1:.2f} ms, x{p1 / p0:.1f}), "
        f"LiteLLM's by {per_k[1]:.3f} ms ({l0:.2f} to {l1:.2f} ms, x{l1 / l0:.1f}): "
        f"{per_k[1] / per_k[0]:.0f} times Polar's slope."
    )


def _retokenize(fam: dict[str, Any]) -> str:
    """What a proxy that re-renders the whole conversation each call would pay: Polar's own cold call."""
    sizes = fam.get("overhead_instant", {}).get("sizes", {})
    if not sizes:
        return ""
    big = max(sizes.values(), key=lambda e: e["tokens"])
    cold, warm = big["paths"]["polar"]["cold"], big["paths"]["polar"]["p50"]
    return (
        f" For scale, Polar's own cold call at {big['tokens']:,} tokens (a full render, which a "
        f"re-tokenizing proxy pays on every call) took {cold:.0f} ms against {warm:.0f} ms warm."
    )


def _concurrency_table(c: dict[str, Any]) -> list[str]:
    out = [
        "| sessions | calls/s (runs) | p50 ms | p99 ms | proxy CPU % | proxy CPU ms/call | "
        "load-generator CPU % | proxy RSS MB | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, v in c["levels"].items():
        cpu_per_call = v["proxy_cpu_percent"] * 10 / v["calls_per_s"] if v["calls_per_s"] else None
        runs = ", ".join(f"{x:.0f}" for x in v.get("calls_per_s_runs", [v["calls_per_s"]]))
        out.append(
            f"| {n} | {v['calls_per_s']:.0f} ({runs}) | {_f(v['latency_p50_ms'])} | "
            f"{_f(v['latency_p99_ms'])} | {v['proxy_cpu_percent']:.0f} | {_f(cpu_per_call)} | "
            f"{v['client_cpu_percent']:.0f} | {v['proxy_rss_mb']:.0f} | {v['errors']} |"
        )
    return out


def _cpu_per_call(fam: dict[str, Any], level: str, family: str = "concurrency") -> float | None:
    """The proxy's CPU ms per call at one concurrency level (its CPU share / calls per second)."""
    v = fam.get(family, {}).get("levels", {}).get(level)
    if not v or not v.get("calls_per_s"):
        return None
    return v["proxy_cpu_percent"] * 10 / v["calls_per_s"]


def _workers(fam: dict[str, Any], keys: dict[str, Any]) -> str:
    """What the multi-process layout measured, and the cores 2,000 calls/s takes at its CPU per call."""
    w = fam.get("concurrency_workers")
    cpu = _cpu_per_call(fam, "256", "concurrency_workers")
    if not w or not cpu:
        return " Its figure was not measured in this run."
    one = keys.get("calls_per_s_256_sessions")
    gain = (
        f" ({keys['calls_per_s_256_sessions_workers_2'] / one:.1f}x one process's in this run)" if one else ""
    )
    return (
        f" Measured with {w['workers']} worker processes (`calls_per_s_256_sessions_workers_2` = "
        f"{_f(keys.get('calls_per_s_256_sessions_workers_2'))}{gain}, 0 errors) at {cpu:.2f} ms of CPU a "
        f"call over the whole tree: {1000 / cpu:,.0f} calls/s per core the workers get, so 2,000 calls/s "
        f"takes about {2000 * cpu / 1000:.1f} dedicated cores of workers (`--workers "
        f"{math.ceil(2000 * cpu / 1000)}` on a machine with cores to spare for the harnesses and the "
        "backend). On this 2-core machine the workers share the cores with the load generator and the "
        "other jobs: the calls/s figure is what their CPU share bought, the CPU per call is the one that "
        "carries to another machine."
    )


def _per_size(fam: dict[str, Any], what: str) -> str:
    sizes = fam.get("overhead_instant", {}).get("sizes", {})
    parts = []
    for e in sizes.values():
        p, q = e["paths"].get("polar", {}), e["paths"].get("litellm", {})
        if what == "cpu" and p.get("cpu_ms_per_call") is not None:
            lite = f" (LiteLLM {q['cpu_ms_per_call']:.2f})" if q.get("cpu_ms_per_call") else ""
            parts.append(f"{e['tokens']:,} tokens: {p['cpu_ms_per_call']:.2f} ms{lite}")
    return "; ".join(parts) or "not measured"


def _cpu_floor(fam: dict[str, Any]) -> str:
    """Whether the proxy's own CPU at 16k already exceeds the 2 ms added-latency target."""
    polar = (
        fam.get("overhead_instant", {}).get("sizes", {}).get("16000", {}).get("paths", {}).get("polar", {})
    )
    cpu = polar.get("cpu_ms_per_call")
    if cpu is None or cpu < 2:
        return ""
    return (
        f" At 16k the proxy's own CPU is {cpu:.2f} ms a call, above the 2 ms target before any wait: "
        "the target needs less work per call, not a quieter machine. The largest self frames in the "
        "profile are the tokenizer encoding the appended turn and the hand-offs to the worker threads "
        "(tokenizer, ledger); an in-loop ledger write and a tokenizer without the worker hop are the next "
        "steps."
    )


def analysis(results: dict[str, Any]) -> str:
    fam, keys = results["families"], results.get("keys", {})
    cpu256 = _cpu_per_call(fam, "256")
    cores = (
        f"{1000 / cpu256:,.0f} calls/s per dedicated core ({cpu256:.2f} ms of proxy CPU a call)"
        if cpu256
        else "not measured"
    )
    workers = _workers(fam, keys)
    return f"""## Why, and what would close the gaps

From the py-spy table above (proxy process, 16k conversation), the CPU columns, and in-process
stage timings made while changing the hot path. What the proxy does per call now: it parses the
body once with `orjson`; for the messages the session's previous request already held
(`proxy/seen.py`, compared as parsed JSON, a C-level `==`) it reuses their validated, converted,
volatile-stripped form and their running prefix hash, so validation, the volatile rules and the
hashing run on the appended messages only (Chat Completions and Anthropic Messages; Responses and
Gemini requests are still decoded whole); the split-turn merge and the volatile output continue
the previous request's; it renders and tokenizes only the appended text (on the event loop when
that is a turn's worth and the tokenizer is free, else on its worker thread); a chain keeps its ids
in one shared list, so a call's prompt is a slice of its parent's, not a copy of the history; it
sends the prompt ids to the backend once, as JSON each id of a chain is encoded into once (a
call's body is its parent's stored encoding and the new ids', `backends/ids_json.py`), and no
longer asks for them back (`usage.prompt_tokens` is checked instead; `--verify-prompt-echo`
restores the echo for debugging); the ledger line holds only what the call adds, written by the
ledger's own thread before the answer goes out; the servers run on `uvloop`; the appended text is
encoded by the Rust
tokenizer's batch encode without offsets (the same ids, a quarter less CPU than transformers'
`encode`); a process hosting a proxy collects cyclic garbage less often (`proxy/app.py`
`GC_THRESHOLDS`: at Python's defaults the collector walked the open sessions' objects over and
over, about a tenth of the CPU at 256 sessions). The export hands each call's prompt out
as a read-only numpy view of its chain's ids (no copy per call) and `orjson` writes the arrays.

- **Proxy CPU per call** (the figure a loaded machine distorts least), instant backend:
  {_per_size(fam, "cpu")}. What still grows with the history is unavoidable byte handling:
  receiving and parsing the resent JSON body, comparing it with the previous one, and sending the
  prompt ids to the backend (a list of all of them, as every token-in backend takes).{_fixed_cost(fam, keys)}
- **Growth** (`per_call_ratio_turn200_vs_turn10` = {_f(keys.get("per_call_ratio_turn200_vs_turn10"))},
  target <= 1.5).{_slope(fam)}{_retokenize(fam)} The slope left is the byte handling above, which any
  proxy that reads the request and feeds a token-in backend pays: the resent body received and parsed
  (it grows with the history; LiteLLM parses it too), the resent messages compared with the previous
  request's (one C-level `==` of the parsed JSON), the prompt's ids copied into the call's own list and
  written to the backend's socket (vLLM and SGLang take the whole list on every call). The ids' JSON
  is not encoded again per call: a chain keeps it and a call appends only its new ids' encoding
  (`backends/ids_json.py`).{_growth_frames(fam)}{_beside_litellm(fam)}
- **Added latency at 16k** (`overhead_p50_ms_16k` = {_f(keys.get("overhead_p50_ms_16k"))} ms,
  target < 2) and **Polar / LiteLLM** (2k {_f(keys.get("ratio_polar_litellm_2k"))}, 16k
  {_f(keys.get("ratio_polar_litellm_16k"))}, 64k {_f(keys.get("ratio_polar_litellm_64k"))}, 128k
  {_f(keys.get("ratio_polar_litellm_128k"))}; target < 0.3 each). Polar's path is two HTTP hops
  (harness to proxy, proxy to backend) plus its CPU per call; on a 2-core machine shared by three
  benchmark processes (client, proxy, backend) and other jobs, the wall-clock figure adds
  scheduler waits that CPU time does not show, so the wall-clock targets are judged here with that
  caveat; the CPU columns compare the two proxies' own work.{_cpu_floor(fam)}
- **Calls/s** (`calls_per_s_256_sessions` = {_f(keys.get("calls_per_s_256_sessions"))}, targets
  >= 1,000 (issues 29 and 50) and >= 2,000 (issue 14)). The proxy is CPU-bound: one process sustains
  about {cores}. On this machine the proxy
  gets the CPU share shown in the concurrency table; the load generator and the other jobs take the
  rest, so 2,000 calls/s in one process needs a dedicated core at under 0.5 ms a call. Sessions are
  independent, so the layout beyond one core is several proxy processes, each owning a share of the
  sessions (`polar proxy serve --workers N`, docs/proxy.md).{workers}
- **Builder, export and ledger** (`build_export_ms_100k` = {_f(keys.get("build_export_ms_100k"))} ms,
  `export_json_ms_100k` = {_f(keys.get("export_json_ms_100k"))} ms, `ledger_bytes_per_token` =
  {_f(keys.get("ledger_bytes_per_token"))}): see the builder section; a call's ledger record stores
  its parent, appended and sampled ids, logprobs and a hash of the whole prompt, so the ledger grows
  with the episode's distinct tokens, and the chain builder verifies token-exactness by that hash.
- **Local model.** With a real model the proxy's CPU per call is a tiny fraction of the call; the
  wall-clock differences between paths there are the model's run-to-run variance on a loaded
  machine (each path's calls ran at different moments), not proxy cost.
"""

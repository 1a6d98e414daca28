"""`polar bench`: run every benchmark family, write figures as JSON and docs/benchmarks.md.

``--quick`` (CI) runs small versions of each family in well under 3 minutes and fails only when
a benchmark breaks (an exception, an error answer), never because the machine is slow.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from bench.common import ANSWER_TEXT, machine_info
from bench.overhead import measure as overhead_measure

KEYS = (
    "overhead_p50_ms_16k",
    "overhead_p99_ms_16k",
    "overhead_p50_ms_16k_litellm",
    "ratio_polar_litellm_2k",
    "ratio_polar_litellm_16k",
    "ratio_polar_litellm_64k",
    "ratio_polar_litellm_128k",
    "per_call_ratio_turn200_vs_turn10",
    "calls_per_s_256_sessions",
    "calls_per_s_256_sessions_workers_2",
    "ledger_bytes_per_token",
    "build_export_ms_100k",
    "export_json_ms_100k",
    "proxy_rss_mb_1024_sessions",
    "pipeline_busy_fraction_staged",
    "pipeline_busy_fraction_collapsed",
    "pipeline_episodes_per_hour_ratio",
    "shapes_typed_vs_dicts",
    "shapes_pydantic_vs_dicts",
    "proxy_cpu_ms_per_call_2k",
    "proxy_cpu_ms_per_call_16k",
    "pipeline_accepted_tokens_per_run_slot_hour_staged",
    "pipeline_accepted_tokens_per_run_slot_hour_collapsed",
)
FULL_RUN_ONLY = (
    "proxy_rss_mb_1024_sessions",
    "ratio_polar_litellm_64k",
    "ratio_polar_litellm_128k",
    "pipeline_busy_fraction_staged",
    "pipeline_busy_fraction_collapsed",
    "pipeline_episodes_per_hour_ratio",
    "pipeline_accepted_tokens_per_run_slot_hour_staged",
    "pipeline_accepted_tokens_per_run_slot_hour_collapsed",
)
RATIO_SIZES = {"2k": 2000, "16k": 16000, "64k": 64000, "128k": 128000}
WORKERS = 2  # the multi-process layout measured beside one process (polar proxy serve --workers 2)


def _settings(quick: bool) -> dict[str, Any]:
    if quick:
        return {
            "sizes": [2000, 16000],
            "calls": 6,
            "runs": 1,
            "local": None,
            "growth_runs": 1,
            "growth_words": 80,
            "levels": [1, 64, 256],
            "seconds": 1.5,
            "conc_runs": 1,
            "builder_sizes": [25_000, 100_000],
            "builder_runs": 1,
            "grading": False,
            "rollouts": False,
            "profile": False,
            "pipeline": False,
            "workspace_runs": 3,
            "shape_answers": 200,
        }
    return {
        "sizes": list(RATIO_SIZES.values()),
        "calls": 30,
        "runs": 3,
        "local": {"sizes": [1000], "calls": 3, "runs": 1, "max_tokens": 8},
        "growth_runs": 5,
        "growth_words": 150,
        "levels": [1, 64, 256, 1024],
        "seconds": 8.0,
        "conc_runs": 2,
        "builder_sizes": [25_000, 50_000, 100_000],
        "builder_runs": 5,
        "grading": True,
        "rollouts": True,
        "profile": True,
        "pipeline": True,
        "workspace_runs": 10,
        "shape_answers": 2000,
    }


class Bench:
    """Runs the families one by one; a family that raises is recorded as an error, not fatal."""

    def __init__(self, quick: bool, workdir: Path, only: set[str] | None):
        self.quick = quick
        self.workdir = workdir
        self.only = only
        self.s = _settings(quick)
        self.results: dict[str, Any] = {
            "quick": quick,
            "machine": machine_info(),
            "families": {},
            "errors": {},
            "notes": {},
            "seconds": {},
        }
        self._renderer: Any = None

    @property
    def renderer(self) -> Any:
        if self._renderer is None:
            from polar_env.backends.embedded import embedded_model_dir
            from polar_env.chat.template import ChatRenderer

            self._renderer = ChatRenderer.from_pretrained(embedded_model_dir())
        return self._renderer

    def answer_ids(self) -> list[int]:
        return (
            self.renderer.tokenizer.encode(ANSWER_TEXT, add_special_tokens=False)
            + self.renderer.eos_token_ids[:1]
        )

    def instant_args(self) -> list[str]:
        return ["--answer-ids", ",".join(map(str, self.answer_ids()))]

    def run(self, name: str, fn: Any) -> None:
        if self.only is not None and name not in self.only:
            self.results["notes"][name] = "not selected (--only)"
            return
        started = time.perf_counter()
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        try:
            value = fn()
            self.results["families"][name] = asyncio.run(value) if asyncio.iscoroutine(value) else value
        except Exception:  # a broken benchmark is reported and fails the run, the others still run
            self.results["errors"][name] = traceback.format_exc(limit=8)
            print(self.results["errors"][name], file=sys.stderr)
        self.results["seconds"][name] = round(time.perf_counter() - started, 1)

    def all(self) -> dict[str, Any]:
        from bench import builder, concurrency, grading, shapes, workspace

        s = self.s
        self.with_paths("instant", self.instant_args(), self._instant_families)
        if s["local"]:
            local = s["local"]
            self.with_paths(
                "local",
                ["--local"],
                lambda paths: self.run(
                    "overhead_local",
                    lambda: overhead_measure(
                        self.renderer,
                        paths,
                        sizes=local["sizes"],
                        calls=local["calls"],
                        runs=local["runs"],
                        max_tokens=local["max_tokens"],
                    ),
                ),
            )
        else:
            self.results["notes"]["overhead_local"] = "skipped in --quick (each call runs the real model)"
        self.run("concurrency", lambda: self._concurrency(concurrency))
        self.run("concurrency_workers", lambda: self._concurrency(concurrency, workers=WORKERS, levels=[256]))
        if 1024 not in s["levels"]:
            self.results["notes"]["concurrency_1024"] = "1024 sessions skipped in --quick"
        self.run("builder", lambda: builder.measure(s["builder_sizes"], s["builder_runs"]))
        self.run("shapes", lambda: shapes.measure(answers=s["shape_answers"]))
        if s["grading"]:
            self.run("grading", lambda: grading.grade_bundled(runs=1))
            self.run("grading_loop", grading.loop_lag_while_grading)
        else:
            self.results["notes"]["grading"] = "skipped in --quick (builds each task's test venv)"
        self.run("workspace", lambda: workspace.measure("bundled", s["workspace_runs"]))
        if s["rollouts"]:
            self.run("rollouts", lambda: self._rollouts(grading))
        else:
            self.results["notes"]["rollouts"] = "skipped in --quick (real harness episodes take minutes)"
        if s["pipeline"]:
            from bench import pipeline

            self.run("pipeline", lambda: pipeline.measure(self.workdir / "pipeline"))
        else:
            self.results["notes"]["pipeline"] = "skipped in --quick (two drivers x 20 real harness episodes)"
        self.results["keys"] = figure_keys(self.results["families"])
        self.results["machine"]["load_avg_1_5_15_end"] = list(os.getloadavg())
        return self.results

    def with_paths(self, tag: str, backend_args: list[str], body: Any) -> None:
        """Start the backend, Polar and LiteLLM once for the families that share them."""
        from bench.paths import open_paths

        if self.only is not None and not self.only & {
            "overhead_instant",
            "growth",
            "profile",
            "profile_2k",
            "profile_growth",
            f"overhead_{tag}",
        }:
            return
        started = time.perf_counter()
        try:
            paths = asyncio.run(open_paths(self.workdir / tag, backend_args, with_litellm=True, tag=tag))
        except Exception:
            self.results["errors"][f"servers_{tag}"] = traceback.format_exc(limit=8)
            return
        self.results["seconds"][f"servers_{tag}"] = round(time.perf_counter() - started, 1)
        try:
            body(paths)
        finally:
            paths.close()

    def _instant_families(self, paths: Any) -> None:
        from bench import growth, profiling

        s = self.s
        self.run(
            "overhead_instant",
            lambda: overhead_measure(
                self.renderer, paths, sizes=s["sizes"], calls=s["calls"], runs=s["runs"]
            ),
        )
        self.run(
            "growth",
            lambda: growth.measure(
                paths,
                self.workdir / "instant" / "ledger-instant",
                runs=s["growth_runs"],
                append_words=s["growth_words"],
            ),
        )
        if s["profile"]:
            self.run(
                "profile",
                lambda: profiling.profile_polar(
                    self.renderer, paths, self.workdir / "polar-profile.txt", size=16000, calls=60
                ),
            )
            self.run(
                "profile_2k",
                lambda: profiling.profile_polar(
                    self.renderer, paths, self.workdir / "polar-profile-2k.txt", size=2000, calls=400
                ),
            )
            self.run("profile_growth", lambda: profiling.profile_growth(paths, self.workdir))

    async def _concurrency(
        self, concurrency: Any, workers: int = 1, levels: list[int] | None = None
    ) -> dict[str, Any]:
        runs = []
        for i in range(self.s["conc_runs"]):
            runs.append(
                await concurrency.measure(
                    self.workdir / f"concurrency-w{workers}-{i}",
                    answer_ids=self.answer_ids(),
                    levels=levels or self.s["levels"],
                    seconds=self.s["seconds"],
                    workers=workers,
                )
            )
        from bench.common import median

        merged = runs[-1]
        for level in merged["levels"]:
            merged["levels"][level]["calls_per_s_runs"] = [r["levels"][level]["calls_per_s"] for r in runs]
            merged["levels"][level]["calls_per_s"] = median(merged["levels"][level]["calls_per_s_runs"])
        merged["errors_total"] = sum(r["errors_total"] for r in runs)
        if merged["errors_total"]:
            raise RuntimeError(
                f"concurrency: {merged['errors_total']} calls failed: "
                f"{[v['first_error'] for v in merged['levels'].values() if v['first_error']]}"
            )
        return merged

    def _rollouts(self, grading: Any) -> dict[str, Any]:
        return {
            f"concurrency_{c}": grading.rollouts_per_hour(
                self.workdir / "rollouts", c, limit=2, timeout_s=1500
            )
            for c in (1, 2)
        }


def figure_keys(f: dict[str, Any]) -> dict[str, float | None]:
    """The headline figures (KEYS) from the families' results."""
    sizes = f.get("overhead_instant", {}).get("sizes", {})
    over = sizes.get("16000", {})
    grow = f.get("growth", {})
    conc = f.get("concurrency", {}).get("levels", {})
    build = f.get("builder", {}).get("sizes", {}).get("100000", {})
    pipe = f.get("pipeline", {}).get("drivers", {})
    keys = {
        "overhead_p50_ms_16k": over.get("added_p50_ms_polar"),
        "overhead_p99_ms_16k": over.get("added_p99_ms_polar"),
        "overhead_p50_ms_16k_litellm": over.get("added_p50_ms_litellm"),
        **{
            f"ratio_polar_litellm_{name}": sizes.get(str(n), {}).get("ratio_p50_polar_vs_litellm")
            for name, n in RATIO_SIZES.items()
        },
        "per_call_ratio_turn200_vs_turn10": grow.get("ratio_cpu_turn200_vs_turn10"),
        "calls_per_s_256_sessions": conc.get("256", {}).get("calls_per_s"),
        "calls_per_s_256_sessions_workers_2": f.get("concurrency_workers", {})
        .get("levels", {})
        .get("256", {})
        .get("calls_per_s"),
        "ledger_bytes_per_token": build.get("ledger_bytes_per_token"),
        "build_export_ms_100k": build.get("build_export_ms"),
        "export_json_ms_100k": build.get("json_ms"),
        "proxy_rss_mb_1024_sessions": conc.get("1024", {}).get("proxy_rss_mb"),
        "pipeline_busy_fraction_staged": pipe.get("staged", {}).get("busy_fraction"),
        "pipeline_busy_fraction_collapsed": pipe.get("collapsed", {}).get("busy_fraction"),
        "pipeline_episodes_per_hour_ratio": f.get("pipeline", {}).get("episodes_per_hour_ratio"),
        "shapes_typed_vs_dicts": f.get("shapes", {}).get("typed_shapes_vs_dicts"),
        "shapes_pydantic_vs_dicts": f.get("shapes", {}).get("pydantic_models_vs_dicts"),
        **{
            f"proxy_cpu_ms_per_call_{name}": sizes.get(str(RATIO_SIZES[name]), {})
            .get("paths", {})
            .get("polar", {})
            .get("cpu_ms_per_call")
            for name in ("2k", "16k")
        },
        **{
            f"pipeline_accepted_tokens_per_run_slot_hour_{driver}": pipe.get(driver, {})
            .get("accepted_work", {})
            .get("accepted_tokens_per_run_slot_hour")
            for driver in ("staged", "collapsed")
        },
    }
    assert tuple(keys) == KEYS
    return keys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--quick", action="store_true", help="small CI version (< 3 min); no Markdown by default"
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="the figures as JSON (default: docs/benchmarks.json for a full run, none with --quick); "
        "with --only, the selected families replace theirs in this file's existing figures",
    )
    parser.add_argument(
        "--md",
        type=Path,
        default=None,
        help="Markdown report (default: docs/benchmarks.md for a full run, none with --quick), "
        "rendered from the --json figures",
    )
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated families: overhead_instant, overhead_local, growth, concurrency, "
        "concurrency_workers, "
        "builder, grading, grading_loop, workspace, rollouts, profile, profile_2k, profile_growth, pipeline",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument(
        "--note",
        default=None,
        help="what else ran on the machine during the run (said in the report's Machine section)",
    )


def merge_families(previous: dict[str, Any], new: dict[str, Any], only: set[str]) -> dict[str, Any]:
    """``previous`` figures with the ``only`` families (and their errors, notes, seconds) from ``new``,
    the run that replaced them listed under ``updates``: an ``--only`` run updates the report, the
    other families' figures stay as their run left them."""
    merged = {**previous}
    for part in ("families", "errors", "notes", "seconds"):
        merged[part] = {k: v for k, v in previous.get(part, {}).items() if k not in only}
        merged[part].update({k: v for k, v in new[part].items() if k in only})
    merged["keys"] = figure_keys(merged["families"])
    kept = [
        u for u in previous.get("updates", []) if not set(u["families"]) <= only
    ]  # wholly superseded: gone
    merged["updates"] = [
        *kept,
        {
            "families": sorted(only),
            "command": new["command"],
            "finished_at": new["finished_at"],
            "total_seconds": new["total_seconds"],
            "machine": new["machine"],
        },
    ]
    return merged


def run(args: argparse.Namespace) -> int:
    only = set(args.only.split(",")) if args.only else None
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="polar-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        bench = Bench(args.quick, workdir, only)
        results = bench.all()
    results["total_seconds"] = round(time.perf_counter() - started, 1)
    results["finished_at"] = time.time()
    results["command"] = "polar " + shlex.join(args.argv)
    if args.note:
        results["machine"]["note"] = args.note
    errors = results["errors"]  # this run's: an --only run answers for its own families
    json_path = args.json or (None if args.quick else Path("docs/benchmarks.json"))
    if only is not None and json_path is not None and json_path.exists():
        results = merge_families(json.loads(json_path.read_text()), results, only)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(results, indent=2, default=str))
    md = args.md or (None if args.quick else Path("docs/benchmarks.md"))
    if md is not None:
        from bench.report import render

        md.parent.mkdir(parents=True, exist_ok=True)
        md.write_text(render(results))
    print(json.dumps(results["keys"], indent=2))
    for name, error in errors.items():
        print(f"benchmark {name} failed:\n{error}", file=sys.stderr)
    return 1 if errors else 0

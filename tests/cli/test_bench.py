"""`polar bench`: the quick run works end to end, and the pieces it is built from are right."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.bench_cli import FULL_RUN_ONLY, KEYS
from bench.builder import synthetic_records, time_once
from bench.common import build_history, percentile, rendered_tokens
from bench.profiling import summarize_raw
from bench.report import render, verdict


def test_percentile_is_nearest_rank() -> None:
    values = [float(x) for x in range(1, 101)]
    assert percentile(values, 50) == 51.0 or percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 99) == 3.0


def test_verdict_says_by_how_much() -> None:
    assert verdict(1.0, 2.0, "<") == "met"
    assert verdict(9.0, 2.0, "<").startswith("missed by 4.5x")
    assert verdict(500.0, 1000.0, ">").startswith("missed by 2.0x")
    assert verdict(None, 2.0, "<") == "not measured"
    assert verdict(1.5, 1.5, "<=") == "met" and verdict(1.6, 1.5, "<=").startswith("missed by 1.1x")


def test_history_has_about_the_requested_length(renderer) -> None:
    for target in (2000, 16000):
        tokens = rendered_tokens(renderer, build_history(renderer, target))
        assert abs(tokens - target) < 0.05 * target


def test_synthetic_trajectory_is_one_chain_of_the_requested_size() -> None:
    info, records = synthetic_records(25_000, calls=50)
    figures = time_once(info, records)
    assert abs(figures["sequence_tokens"] - 25_000) < 1_000
    assert figures["build_export_ms"] > 0


def test_py_spy_raw_profile_is_summarized(tmp_path: Path) -> None:
    raw = tmp_path / "p.txt"
    raw.write_text(
        "main (a.py:1);handler (polar_env/proxy/app.py:9);dumps (json/__init__.py:2) 3\n"
        "main (a.py:1);handler (polar_env/proxy/app.py:9) 1\n"
    )
    summary = summarize_raw(raw)
    assert summary["samples"] == 4
    assert summary["self"][0] == {"frame": "dumps (json/__init__.py:2)", "percent": 75.0}
    assert summary["polar_inclusive"] == [{"frame": "handler (polar_env/proxy/app.py:9)", "percent": 100.0}]


def test_report_renders_partial_results() -> None:
    results = {
        "command": "polar bench",
        "machine": {"cpus": 2},
        "families": {},
        "errors": {"growth": "Boom\nValueError: x"},
        "notes": {"grading": "skipped"},
        "keys": dict.fromkeys(KEYS),
    }
    text = render(results)
    assert "| per-call proxy CPU, turn 200 / turn 10 (`per_call_ratio_turn200_vs_turn10`) | null |" in text
    assert "`growth`: failed: `ValueError: x`" in text and "`grading`: skipped" in text


@pytest.mark.slow
def test_quick_bench_reports_every_key(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "polar_env.cli", "bench", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["errors"] == {}
    for key in KEYS:
        assert key in results["keys"]
        value = results["keys"][key]
        assert value is None or isinstance(value, (int, float)), (key, value)
    # measured in --quick (LiteLLM only where it is installed; 64k, 128k and 1,024 sessions in the full run
    # only)
    for key in set(KEYS) - {
        "overhead_p50_ms_16k_litellm",
        *(k for k in KEYS if k.startswith("ratio_polar_litellm")),
        *FULL_RUN_ONLY,
    }:
        assert isinstance(results["keys"][key], (int, float)), key
    assert results["families"]["concurrency"]["errors_total"] == 0

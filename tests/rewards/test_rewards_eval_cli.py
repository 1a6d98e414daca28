"""`polar eval` over the bundled set with a SWE-bench predictions file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar_env.cli import main as polar_main
from polar_env.tasks.loader import load_tasks

pytestmark = pytest.mark.needs("bwrap")


@pytest.mark.slow
def test_eval_reports_like_swe_bench(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    tasks = load_tasks("bundled")
    preds = [
        {"instance_id": t.instance_id, "model_patch": t.patch, "model_name_or_path": "gold"} for t in tasks
    ]
    preds[0]["model_patch"] = ""
    pred_file = tmp_path / "preds.jsonl"
    pred_file.write_text("".join(json.dumps(p) + "\n" for p in preds))
    out = tmp_path / "report.json"

    assert (
        polar_main(
            [
                "eval",
                "--tasks",
                "bundled",
                "--predictions",
                str(pred_file),
                "--workers",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )

    report = json.loads(out.read_text())
    n = len(tasks)
    assert report["submitted_instances"] == n and report["completed_instances"] == n
    assert report["resolved_instances"] == n - 1
    assert report["empty_patch_instances"] == 1 and report["failure_kinds"]["empty_patch"] == [
        tasks[0].instance_id
    ]
    assert set(report["resolved_ids"]) == {t.instance_id for t in tasks[1:]}
    assert report["instances"][tasks[1].instance_id]["reward"] == 1.0
    text = capsys.readouterr().out
    assert f"Resolved: {n - 1}/{n}" in text and f"{tasks[0].instance_id}: unresolved (empty_patch)" in text


def test_eval_rejects_unknown_instances(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    pred_file = tmp_path / "preds.json"
    pred_file.write_text(
        json.dumps([{"instance_id": "nope__nope-1", "model_patch": "", "model_name_or_path": "m"}])
    )
    assert polar_main(["eval", "--tasks", "bundled", "--predictions", str(pred_file)]) == 2
    assert "nope__nope-1" in capsys.readouterr().err


def test_eval_verified_offline_fails_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.setenv("POLAR_CACHE", str(tmp_path))
    pred_file = tmp_path / "preds.jsonl"
    pred_file.write_text("")
    monkeypatch.setattr("polar_env.tasks.loader.VERIFIED_DATASET", str(tmp_path / "no-such-dataset-dir"))
    assert polar_main(["eval", "--tasks", "verified", "--predictions", str(pred_file)]) == 2
    assert "cannot load" in capsys.readouterr().err

"""`polar demo --quick` (what the README's first command runs) produces outputs that pass `polar check`;
with the gold-replay policy the same pipeline earns reward 1.0 from real grading."""

from __future__ import annotations

import json
import shutil

import pytest

from polar_env.cli import main as polar_main
from polar_env.trajectory.export import read_trajectories

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("npm") is None,
                                 reason="needs bubblewrap and npm")]


@pytest.mark.parametrize("policy", ["model", "gold"])
def test_quick_demo_outputs_pass_polar_check(policy, tmp_path, capsys):
    out = tmp_path / "demo"
    extra = ["--max-tokens", "1024"] if policy == "gold" else []  # the gold patch is one long tool call
    assert polar_main(["demo", "--quick", "--out", str(out), "--policy", policy, *extra]) == 0
    printed = capsys.readouterr().out.lower()
    assert "model:  smollm2-135m-instruct" in printed and "policy: " in printed
    for name in ("trajectories.jsonl", "nemo_results.jsonl", "grpo_batch.jsonl", "summary.json", "viewer.html"):
        assert (out / name).stat().st_size > 0, name
    for name in ("trajectories.jsonl", "nemo_results.jsonl", "grpo_batch.jsonl"):
        assert polar_main(["check", str(out / name)]) == 0, name
    trajectories = list(read_trajectories(out / "trajectories.jsonl"))
    assert len(trajectories) == 2 and all(t.grading for t in trajectories)
    assert all(t.stats.trainable_tokens > 0 for t in trajectories)
    summary = json.loads((out / "summary.json").read_text())
    if policy == "gold":
        assert summary["resolved"] == 2, [t.grading["failure_kind"] for t in trajectories]
        assert all(t.stats.calls >= 2 and t.stats.chains == 1 for t in trajectories)

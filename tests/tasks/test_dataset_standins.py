"""The datasets past Verified, end to end on local stand-ins of their published images
(tests/dataset_standins.py): a row in the dataset's own schema, ``polar rollout --tasks NAME:FILE.jsonl``
with the gold and the no-op policy in podman, graded by that dataset's procedure in strict mode. The
image is checked first (the control): nothing of the task environment outside its activation, the fix
in the image's history."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dataset_standins import ROWS, conda_standin, in_image
from repo_paths import REPO

from polar_env.episodes.workspace import engine_available
from polar_env.tasks.datasets import DATASETS
from polar_env.tasks.loader import load_bundled

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not engine_available("podman"), reason="needs podman (scripts/setup_podman.sh)"),
]
ENGINE = "podman"
TASK_ID = "psf__requests-5414"  # its bundled image is shared with test_containers_podman and test_history_e2e


def _polar(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "polar_env.cli", *args], capture_output=True, text=True, env=env, timeout=900
    )


@pytest.fixture(scope="module")
def rows_of(tmp_path_factory):
    """``rows_of(NAME)``: a file of one row of the bundled requests task in dataset NAME's schema, its image
    the stand-in under the name NAME's loader gives it (built once, checked once)."""
    task = next(t for t in load_bundled() if t.instance_id == TASK_ID)
    made: dict[str, Path] = {}

    def make(dataset: str) -> Path:
        if dataset not in made:
            row = ROWS[dataset](task)
            image = conda_standin(task, DATASETS[dataset].to_task(row).image, ENGINE)
            # the control: pytest is the conda env's only, the activation finds it; the fix is in the history
            if not made:
                bare = subprocess.run(
                    in_image(ENGINE, image, "command -v pytest python"), capture_output=True, text=True
                )
                assert bare.returncode != 0 and not bare.stdout.strip(), bare.stdout
                active = subprocess.run(
                    in_image(
                        ENGINE,
                        image,
                        "source /opt/miniconda3/bin/activate; conda activate "
                        "testbed; command -v pytest; cd /testbed && git log --all --format=%s",
                    ),
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
                assert active[0] == "/opt/miniconda3/envs/testbed/bin/pytest" and "fix" in active, active
            made[dataset] = tmp_path_factory.mktemp(dataset) / "rows.jsonl"
            made[dataset].write_text(json.dumps(row) + "\n")
        return made[dataset]

    return make


@pytest.mark.parametrize(
    ("dataset", "sandbox", "policy", "reward"),
    [
        ("swe-gym", ENGINE, "gold", 1.0),
        ("swe-gym", ENGINE, "noop", 0.0),
        ("swe-gym", "apptainer", "gold", 1.0),  # docker://<the image>, through tests/apptainer_standin.py
        ("swe-rebench", ENGINE, "gold", 1.0),
        ("swe-rebench", ENGINE, "noop", 0.0),
    ],
)
def test_rollout_on_the_datasets_stand_in(
    rows_of,
    dataset: str,
    sandbox: str,
    policy: str,
    reward: float,
    tmp_path: Path,
    request: pytest.FixtureRequest,
):
    """``polar rollout --tasks NAME:FILE.jsonl``: the gold patch 1.0, doing nothing 0, graded strictly in the
    image by the dataset's procedure (its conda env activated: there is no pytest without it)."""
    if sandbox == "apptainer":  # apptainer cannot be installed here: each exec a `podman run` of the image
        request.getfixturevalue("apptainer_log")
    out = tmp_path / "out"
    proc = _polar(
        "rollout",
        "--tasks",
        f"{dataset}:{rows_of(dataset)}",
        "--sandbox",
        sandbox,
        "--policy",
        policy,
        "--out",
        str(out),
        "--timeout",
        "300",
        "--score-window",
        "256",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (traj,) = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert traj["metadata"]["workspace"] == sandbox and traj["reward"] == reward, (
        traj["reward"],
        proc.stdout[-2000:],
    )
    grade = traj["grading"]
    if policy == "gold":  # both modes ran in the image, and the record's verdict is the strict one
        assert grade["mode"] == "strict" and set(grade["modes"]) == {"strict", "swebench"}, grade
        assert all(m["reward"] == 1.0 for m in grade["modes"].values()), grade
    else:
        assert grade["failure_kind"] == "empty_patch", grade


def test_a_special_casing_patch_earns_nothing_on_swe_gym(rows_of, tmp_path: Path):
    """``polar eval --tasks swe-gym:FILE.jsonl`` of the red-team corpus's special-casing patch for this task
    (fixed for the issue's example only): graded, not resolved."""
    patch = (REPO / "tests" / "redteam" / "patches" / "sc-issue-example-input.diff").read_text()
    preds = tmp_path / "preds.jsonl"
    preds.write_text(
        json.dumps({"instance_id": TASK_ID, "model_patch": patch, "model_name_or_path": "sc"}) + "\n"
    )
    proc = _polar(
        "eval",
        "--tasks",
        f"swe-gym:{rows_of('swe-gym')}",
        "--predictions",
        str(preds),
        "--sandbox",
        ENGINE,
        "--out",
        str(tmp_path / "r.json"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["resolved_ids"] == [] and report["error_instances"] == 0, report

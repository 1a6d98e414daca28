"""Per-task pinned venvs: built once under POLAR_CACHE, without pip, rebuilt when the pins change."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from polar_env.tasks.env import STAMP, EnvBuildError, ensure_task_env, env_dir, env_ready
from polar_env.tasks.models import Task, TaskEnvironment


def tiny_task(requirements: list[str], python: str = "3.11") -> Task:
    return Task(
        instance_id="demo__demo-1",
        repo="demo/demo",
        problem_statement="x",
        test_patch="diff --git a/tests/test_x.py b/tests/test_x.py\n",
        FAIL_TO_PASS=["tests/test_x.py::test_x"],
        environment=TaskEnvironment(python=python, requirements=requirements),
    )


@pytest.mark.slow
def test_env_is_built_pinned_and_rebuilt_on_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("POLAR_CACHE", str(tmp_path))
    task = tiny_task(["iniconfig==2.0.0"])
    venv = ensure_task_env(task)
    assert venv == tmp_path / "envs" / "demo__demo-1" == env_dir(task)
    assert env_ready(task) and json.loads((venv / STAMP).read_text())["instance_id"] == "demo__demo-1"
    py = venv / "bin" / "python"
    assert str(py.resolve()).startswith("/usr/"), "interpreter must resolve inside the sandbox's /usr"
    out = subprocess.run(
        [py, "-c", "import iniconfig, sys; print(sys.prefix)"], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip() == str(venv)
    assert subprocess.run([py, "-m", "pip", "--version"], capture_output=True).returncode != 0, (
        "no pip inside"
    )

    mtime = (venv / STAMP).stat().st_mtime_ns
    assert ensure_task_env(task) == venv and (venv / STAMP).stat().st_mtime_ns == mtime, "cached"

    changed = tiny_task(["iniconfig==1.1.1"])
    assert not env_ready(changed)
    ensure_task_env(changed)
    assert env_ready(changed) and not env_ready(task)


def test_unknown_interpreter_is_an_env_build_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("POLAR_CACHE", str(tmp_path))
    with pytest.raises(EnvBuildError, match="python9.99"):
        ensure_task_env(tiny_task([], python="9.99"))

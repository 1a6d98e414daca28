"""The suite stands alone: a test that reads a file beside the clone fails, and ordinary reads pass."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

from outside_reads import OutsideReadGuard, install, uninstall
from repo_paths import TESTS


def _local_modules_imported_by(source: Path) -> list[str]:
    """The tests/ helper files ``source`` imports: read from its imports, so a new helper is never missed."""
    names = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return sorted(f"{name}.py" for name in names if (source.parent / f"{name}.py").is_file())


def _layout(tmp_path: Path) -> tuple[Path, Path]:
    """``work/repo`` with a ``work/shared/req.json`` beside it, as a checkout beside a shared folder."""
    repo, shared = tmp_path / "work" / "repo", tmp_path / "work" / "shared"
    (repo / "tests").mkdir(parents=True)
    shared.mkdir()
    (shared / "req.json").write_text("{}")
    (repo / "inside.json").write_text("{}")
    return repo, shared


def test_reads_beside_the_repository_are_recorded_and_nothing_else(tmp_path):
    repo, shared = _layout(tmp_path)
    guard = install(OutsideReadGuard(repo))
    try:
        (repo / "inside.json").read_text()
        (repo / ".." / "repo" / "inside.json").read_text()
        later = tmp_path / "work" / "made-by-the-test"  # not there when the guard started
        later.mkdir()
        (later / "out.txt").write_text("x")
        (later / "out.txt").read_text()
        (shared / "written.txt").open("w").close()  # writing learns nothing
        assert guard.take() == []

        (repo / ".." / "shared" / "req.json").read_text()
        os.listdir(shared)
        fd = os.open(shared / "req.json", os.O_RDONLY)
        os.close(fd)
        assert guard.take() == [str(shared / "req.json"), str(shared), str(shared / "req.json")]
    finally:
        uninstall(guard)


def test_a_test_reading_beside_the_clone_fails_the_run(tmp_path):
    """The conftest wiring, run as pytest itself: one test reads ``../shared`` and must fail."""
    repo, _ = _layout(tmp_path)
    for helper in ("conftest.py", *_local_modules_imported_by(TESTS / "conftest.py")):
        shutil.copy(TESTS / helper, repo / "tests" / helper)
    (repo / "tests" / "test_reads.py").write_text(
        "from pathlib import Path\n"
        "ROOT = Path(__file__).resolve().parents[1]\n"
        "def test_inside():\n    assert (ROOT / 'inside.json').read_text() == '{}'\n"
        "def test_beside():\n    assert (ROOT.parent / 'shared' / 'req.json').read_text() == '{}'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed, 1 passed" in run.stdout, run.stdout
    assert "FAILED tests/test_reads.py::test_beside" in run.stdout
    assert "read paths outside the repository" in run.stdout
    assert str(tmp_path / "work" / "shared" / "req.json") in run.stdout

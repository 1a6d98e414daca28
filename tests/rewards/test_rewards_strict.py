"""Fast unit tests of strict grading's judgement: what the tested code can put in the result stream,
the config pipe, the grader's argv and the tree never raises past the grader (masked) — it scores 0."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from polar_env.outcomes import FailureKind
from polar_env.rewards import strict_run
from polar_env.rewards.flags import is_tamper
from polar_env.rewards.grading import GradingMode, against_gold, gold_notes, grade
from polar_env.rewards.grading import TestRun as Run
from polar_env.rewards.patch import ApplyMethod, apply_patch, tree_patch
from polar_env.rewards.sandbox_exec import SandboxRun
from polar_env.rewards.strict_run import judge_stream
from polar_env.tasks.loader import load_tasks
from polar_env.tasks.models import Task
from polar_env.tasks.tree import materialize

needs_bwrap = pytest.mark.needs("bwrap")

NONCE = "n" * 32
CONFIG = {"nonce": NONCE}


def _stream(*events: dict) -> bytes:
    return b"".join(
        json.dumps({"seq": i, "nonce": NONCE, **e}).encode() + b"\n" for i, e in enumerate(events)
    )


def _honest(**end: object) -> list[dict]:
    return [
        {"t": "collected", "ids": ["t.py::test_a"]},
        {"t": "phase", "id": "t.py::test_a", "when": "setup", "outcome": "passed"},
        {"t": "phase", "id": "t.py::test_a", "when": "call", "outcome": "passed"},
        {"t": "phase", "id": "t.py::test_a", "when": "teardown", "outcome": "passed"},
        {"t": "end", "exitstatus": 0, "testsfailed": 0, **end},
    ]


def _judge(data: bytes, rc: int = 0):
    return judge_stream(data, len(data), CONFIG, SandboxRun(rc, "", False, 0.1), "o/r")


def test_honest_stream_is_believed():
    out = _judge(_stream(*_honest()))
    assert out.valid and out.statuses == {"t.py::test_a": "PASSED"}, out


def test_line_nested_past_the_parser_is_forged_not_an_exception():
    out = _judge(b"[" * 100000 + b"\n" + _stream(*_honest()))
    assert not out.valid and out.violations[0].startswith("stream-forged"), out


def test_forged_field_types_are_forged_not_exceptions():
    for end in ({"exitstatus": "x"}, {"testsfailed": [1]}, {"exitstatus": {"a": 1}}):
        out = _judge(_stream(*_honest(**end)))
        assert not out.valid and any(v.startswith("stream-forged") for v in out.violations), (end, out)
    bad = _honest()
    bad[0]["ids"] = 7
    out = _judge(_stream(*bad))
    assert not out.valid and any(v.startswith("stream-forged") for v in out.violations), out
    out = _judge(_stream(*_honest(), {"t": "tampered", "keys": 5}))
    assert not out.valid, out


def _fake_sandbox(read_config: bool):
    def run(argv, *, pass_fds, **_):
        cfg_fd = pass_fds[0]
        if read_config:
            data = b""
            while chunk := os.read(cfg_fd, 65536):
                data += chunk
            got["config"] = json.loads(data)
        return SandboxRun(0, "", False, 0.0)

    got: dict = {}
    return run, got


def test_config_past_the_pipe_buffer_does_not_deadlock(monkeypatch, tmp_path):
    """A config larger than a pipe's 64 KiB buffer reaches the plugin whole, and a run
    that never reads it (a sandbox that did not start) still returns."""
    config = {
        "nonce": NONCE,
        "padding": {f"tests/test_{i}.py": [["test_x", "pass", "assert 1"]] for i in range(8000)},
    }
    assert len(json.dumps(config)) > 4 * 65536
    for read_config in (True, False):
        run, got = _fake_sandbox(read_config)
        monkeypatch.setattr(strict_run, "run_sandboxed", run)
        done: list = []
        t = threading.Thread(
            target=lambda done=done: done.append(
                strict_run._run_with_stream(
                    ["true"],
                    tree=tmp_path,
                    venv=tmp_path,
                    env={},
                    timeout_s=5,
                    grader_dir=tmp_path,
                    grader_mount="/opt/g",
                    config=config,
                )
            ),
            daemon=True,
        )
        t.start()
        t.join(20)
        assert done, f"_run_with_stream blocked on the config pipe (reader: {read_config})"
        assert not read_config or got["config"] == config


def test_notes_are_not_tampering():
    assert not is_tamper("note:output-truncated") and not is_tamper("note:ghost-id")
    assert not is_tamper("note:perturbed-skipped") and not is_tamper("reset:test-file")
    assert is_tamper("ghost-id") and is_tamper("perturbed-run") and is_tamper("stream-forged")


def test_ungraded_ghost_ids_are_a_note_graded_ones_a_violation():
    """An honest patch can change parametrize ids built from source: ids the gold run did not collect
    that no report reads are a note; a graded id the gold run never collected is still a violation."""
    task = next(t for t in load_tasks("bundled") if t.instance_id == "pallets__flask-5014")
    f2p = task.FAIL_TO_PASS[0]
    gold = Run(valid=True, collected=[f2p, "tests/test_x.py::test_p[a]"], status_map={f2p: "PASSED"})
    run = Run(valid=True, collected=[f2p, "tests/test_x.py::test_p[b]"], status_map={f2p: "PASSED"})
    assert against_gold(task, run, gold) == []
    assert "note:ghost-id" in gold_notes(task, run, gold)
    forged = task.model_copy(update={"PASS_TO_PASS": [*task.PASS_TO_PASS, "tests/test_x.py::test_p[b]"]})
    assert any(v.startswith("ghost-id") for v in against_gold(forged, run, gold))


def _with_test_patch(task: Task, tmp: Path, edit) -> Task:
    """``task`` whose test patch also makes ``edit(tree)`` (on the base tree with the test patch applied)."""
    tree = materialize(task, tmp / "tp")
    assert apply_patch(tree, task.test_patch)[0] == ApplyMethod.git_apply
    edit(tree)
    return task.model_copy(update={"test_patch": tree_patch(tree)})


@needs_bwrap
def test_perturbed_check_is_skipped_where_the_gold_patch_fails_it(tmp_path: Path):
    """An honest test module that reads its own name (a data file named after it, a test referring to its
    module) fails the perturbed run for every patch: the gold patch's control shows it, and the check is
    skipped (a note) instead of scoring the gold patch 0."""
    base = next(t for t in load_tasks("bundled") if t.instance_id == "pallets__flask-5014")

    def edit(tree: Path) -> None:
        with open(tree / "tests" / "test_blueprints.py", "a") as f:
            f.write(
                '\nassert __name__.rpartition(".")[2] == "test_blueprints"  # e.g. a data file named after '
                "it\n"
            )

    task = _with_test_patch(base, tmp_path, edit)
    r = grade(task, task.patch)
    assert r.reward == 1.0 and r.modes[GradingMode.strict].reward == 1.0, (r.error, r.flags, r.flag_evidence)
    assert "note:perturbed-skipped" in r.flags and "perturbed-run" not in r.flags, r.flags


def _long_path_patch(n: int, root: str = "src/flask") -> str:
    deep = "/".join(["d" * 200] * 9)
    return "".join(
        f"diff --git a/{root}/{deep}/m{i}.py b/{root}/{deep}/m{i}.py\nnew file mode 100644\n"
        f"--- /dev/null\n+++ b/{root}/{deep}/m{i}.py\n@@ -0,0 +1 @@\n+x = {i}\n"
        for i in range(n)
    )


@needs_bwrap
def test_patch_past_the_argument_limit_is_refused_not_masked():
    """1300 new source files of ~1.8 KB names: past ARG_MAX as the grader's git arguments. Refused
    (apply_failed, 0), where it was an E2BIG OSError, i.e. infrastructure (masked)."""
    task = next(t for t in load_tasks("bundled") if t.instance_id == "pallets__flask-5014")
    r = grade(task, task.patch + _long_path_patch(1300))
    assert r.failure_kind == FailureKind.apply_failed and r.reward == 0.0, (r.failure_kind, r.error[:300])
    assert "more than the grader takes" in r.error


NEW_TEST = "tests/newdir/test_new.py"
BLOCKER = (
    "diff --git a/tests/newdir b/tests/newdir\nnew file mode 100644\n--- /dev/null\n+++ b/tests/newdir\n"
    "@@ -0,0 +1 @@\n+not a directory\n"
)


def _task_with_new_test_file(tmp: Path) -> Task:
    base = next(t for t in load_tasks("bundled") if t.instance_id == "pallets__flask-5014")

    def edit(tree: Path) -> None:
        (tree / "tests" / "newdir").mkdir()
        (tree / NEW_TEST).write_text("def test_new():\n    assert True\n")

    return _with_test_patch(base, tmp, edit)


@needs_bwrap
def test_new_test_file_whose_parent_the_agent_made_a_file_still_applies(tmp_path: Path):
    """The test patch adds tests/newdir/test_new.py; the agent's patch made tests/newdir a file. The reset
    gives every test-patch path real parent directories, so the test patch applies (it was task_defect:
    masked) and the fix is graded."""
    task = _task_with_new_test_file(tmp_path)
    r = grade(task, task.patch + BLOCKER)
    assert r.failure_kind == FailureKind.none and r.reward == 1.0, (r.failure_kind, r.error[:400])
    assert r.modes[GradingMode.swebench].reward == 1.0


@needs_bwrap
def test_test_patch_refused_on_the_patched_tree_is_the_patchs_zero(tmp_path: Path, monkeypatch):
    """Whatever else makes the test patch fail on the patched tree (here: a blocker the reset leaves),
    the base takes it, so it is the patch's doing: test_crash (0), never task_defect (masked)."""
    from polar_env.rewards import workspace

    task = _task_with_new_test_file(tmp_path)
    restore = workspace.GradingTree.restore

    def leaves_the_blocker(self, paths):
        restore(self, paths)
        if NEW_TEST in paths:
            shutil.rmtree(self.tree / "tests" / "newdir", ignore_errors=True)
            (self.tree / "tests" / "newdir").write_text("blocker\n")

    monkeypatch.setattr(workspace.GradingTree, "restore", leaves_the_blocker)
    r = grade(task, task.patch + BLOCKER)
    assert r.failure_kind == FailureKind.test_crash and r.reward == 0.0, (r.failure_kind, r.error[:400])
    assert "applies to the base" in r.error


@needs_bwrap
def test_unexpected_exception_after_the_tests_ran_is_the_patchs_zero(monkeypatch):
    """Once the patched tree's sandbox started, the tested code may have shaped whatever raised in the
    grader (a forged value it coerces): test_crash (0), not "grader error" infrastructure (masked)."""
    from polar_env.rewards import grading

    task = next(t for t in load_tasks("bundled") if t.instance_id == "pallets__flask-5014")

    def forged(*_a, **_k):
        raise TypeError("int() argument must be a string, not 'dict'")

    monkeypatch.setattr(grading, "against_gold", forged)
    r = grade(task, task.patch)
    assert r.failure_kind == FailureKind.test_crash and r.reward == 0.0, (r.failure_kind, r.error[:300])
    assert r.modes[GradingMode.strict].failure_kind == FailureKind.test_crash


def test_image_reset_gives_test_patch_paths_real_parents(tmp_path: Path):
    """image_strict's RESTORE loop (run here with bash, git left out): a file or a link the agent put where
    a test-patch path's directory belongs is replaced by a directory, and nothing is removed through the
    link."""
    import subprocess

    from polar_env.rewards.image_strict import RESTORE

    lines = RESTORE.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("for p in"))
    end = next(i for i, line in enumerate(lines) if line.startswith("done"))
    loop = "set -e\n" + "\n".join(line for line in lines[start : end + 1] if "cat-file" not in line) + "\n"
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    (tree / "tests").mkdir(parents=True)
    outside.mkdir()
    (outside / "sub").mkdir()
    (outside / "sub" / "keep").write_text("host\n")
    (tree / "tests" / "newdir").write_text("agent's file\n")
    (tree / "tests" / "linkdir").symlink_to(outside)
    subprocess.run(
        ["bash", "-c", loop, "bash", "tests/newdir/test_x.py", "tests/linkdir/sub/keep", "top.py"],
        cwd=tree,
        check=True,
    )
    for d in ("tests/newdir", "tests/linkdir", "tests/linkdir/sub"):
        assert (tree / d).is_dir() and not (tree / d).is_symlink(), d
    assert (outside / "sub" / "keep").read_text() == "host\n"


def test_image_reset_refuses_a_link_that_leaves_the_final_tree(tmp_path: Path):
    """Failed before image_strict's RESTORE checked the final tree's links: run with bash (git left out),
    a link that leaves the tree once ``tests/static`` is a real directory exits 96 (refused); links
    that stay inside pass."""
    import subprocess

    from polar_env.rewards.image_strict import GIT, RESTORE

    lines = RESTORE.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("find . "))
    check = "\n".join(lines[start:]).replace(GIT, "false")
    tree = tmp_path / "tree"
    env = {**os.environ, "POLAR_TREE": str(tree)}  # the task's tree, as the grader exports it
    (tree / "tests" / "static").mkdir(parents=True)
    (tree / "src").mkdir()
    (tree / "src" / "in").symlink_to("../tests/static")
    ok = subprocess.run(
        ["bash", "-c", "set -e\nbase=x\n" + check], cwd=tree, env=env, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    (tree / "src" / "out").symlink_to("../tests/static/" + "../" * 16 + "tmp")
    refused = subprocess.run(
        ["bash", "-c", "set -e\nbase=x\n" + check], cwd=tree, env=env, capture_output=True, text=True
    )
    assert refused.returncode == 96 and "src/out: symlink leaves the tree" in refused.stdout, refused


@needs_bwrap
def test_gold_control_that_timed_out_is_not_a_reason_to_skip(tmp_path: Path, monkeypatch):
    """A gold perturbed control that timed out (a loaded machine) says nothing of the gold patch: the gold
    run is not believed (masked, not cached), rather than skipping every patch's perturbed check."""
    from polar_env.rewards import gold_runs, grading
    from polar_env.tasks.base_trees import base_key

    base = next(t for t in load_tasks("bundled") if t.instance_id == "pallets__flask-5014")

    def edit(tree: Path) -> None:
        with open(tree / "tests" / "test_blueprints.py", "a") as f:
            f.write("\n# a fresh gold cache key\n")

    task = _with_test_patch(base, tmp_path, edit)
    monkeypatch.setattr(grading, "perturbed_findings", lambda *a, **k: ["perturbed-run: timed out"])
    r = grade(task, task.patch)
    assert r.failure_kind == FailureKind.infrastructure and "perturbed control" in r.error, (
        r.failure_kind,
        r.error,
    )
    assert gold_runs.cached(gold_runs.gold_key(task, f"tree:{base_key(task)}"), grading.TestRun) is None


def test_hidden_code_is_flagged_and_no_gold_patch_is():
    """Code decoded and run (the issue-48 forger shipped zlib+base64 under exec), or code objects loaded
    or edited, raise ``hidden-code``; none of the gold patches the repository holds does."""
    import base64
    import zlib

    import scripts.hidden_code_fpr as fpr
    from polar_env.rewards.flags import tampering_flags

    blob = base64.b64encode(zlib.compress(b"import _pytest.reports\n")).decode()
    hidden = (
        "diff --git a/src/pkg/_data.py b/src/pkg/_data.py\n+++ b/src/pkg/_data.py\n"
        f"+import base64 as _b, zlib as _z\n+_BLOB = {blob!r}\n+\n+\n+def _load():\n"
        f"+    exec(_z.decompress(_b.b64decode(_BLOB)), {{}})\n"
    )
    assert "hidden-code" in tampering_flags(hidden, "o/r")
    swap = "diff --git a/a.py b/a.py\n+++ b/a.py\n+f.__code__ = g.__code__\n"
    assert "hidden-code" in tampering_flags(swap, "o/r")
    golds = fpr.gold_patches()
    assert len(golds) >= 11 and not [g[0] for g in golds if "hidden-code" in tampering_flags(g[1], g[2])]

"""Grade one agent patch against one task, the way SWE-bench's harness does.

Fresh base tree -> apply the agent patch -> reset the test files and apply the test patch ->
run the test command between the harness markers in a network-less sandbox under the grading
deadline -> parse per-test status with SWE-bench's parser -> resolved iff every FAIL_TO_PASS
test passes and no PASS_TO_PASS test breaks. Failures that are not the agent's (sandbox, env,
task data) are `infrastructure` / `task_defect` (polar_env.outcomes), masked instead of punishing the policy.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, Field

from polar_env.outcomes import FailureKind
from polar_env.rewards import swebench_compat as sb
from polar_env.rewards.patch import ApplyMethod, apply_patch
from polar_env.rewards.sandbox_exec import (
    TREE_MOUNT,
    SandboxUnavailable,
    prepare_tree_owner,
    run_sandboxed,
)
from polar_env.tasks.env import EnvBuildError, ensure_task_env
from polar_env.tasks.models import DIFF_HEADER, Task
from polar_env.tasks.tree import git, materialize

DEFAULT_GRADING_TIMEOUT_S = float(os.environ.get("POLAR_GRADING_TIMEOUT_S", "900"))
LOG_TAIL_CHARS = 4000


class GradeResult(BaseModel):
    instance_id: str
    resolved: bool = False
    reward: float = 0.0
    failure_kind: FailureKind = FailureKind.none
    patch_applied: bool = False
    apply_method: ApplyMethod = ApplyMethod.none
    fail_to_pass: dict[str, str] = Field(default_factory=dict)  # test -> PASSED/FAILED/.../MISSING
    pass_to_pass: dict[str, str] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)
    log_tail: str = ""
    error: str = ""

    @property
    def is_infrastructure_failure(self) -> bool:
        """Grading could not say anything about the patch (mask, don't punish)."""
        return self.failure_kind.outside_policy


def eval_script(task: Task) -> str:
    """The script run in the sandbox: test command between SWE-bench's markers, exit code after."""
    return "\n".join(
        [
            f"echo {shlex.quote(sb.START_TEST_OUTPUT)}",
            task.full_test_command(),
            "rc=$?",
            f"echo {shlex.quote(sb.END_TEST_OUTPUT)}",
            f'echo "{sb.TEST_EXIT_CODE}: $rc"',
        ]
    )


TEST_DIRS = frozenset({"test", "tests", "testing"})
TEST_CONFIG_FILES = frozenset({"conftest.py", "pytest.ini", "tox.ini"})


def agent_test_files(model_patch: str) -> list[str]:
    """Test code and pytest configuration the agent's patch touches (either side of a rename).

    Grading runs the task's tests as they are at base: an agent that edits a test, deletes one, or
    adds a ``conftest.py`` hook that rewrites outcomes must not change what is graded.
    """
    seen: dict[str, None] = {}
    for pair in DIFF_HEADER.findall(model_patch):
        for rel in pair:
            parts = Path(rel).parts
            if not parts or rel.startswith("/") or ".." in parts:  # never a path outside the tree
                continue
            name = parts[-1]
            if (name in TEST_CONFIG_FILES or name.startswith("test_") or name.endswith("_test.py")
                    or TEST_DIRS & set(parts[:-1])):
                seen.setdefault(rel, None)
    return list(seen)


def reset_test_files(tree: Path, task: Task, base: str, extra: list[str] | tuple[str, ...] = ()) -> None:
    """Put every file the test patch touches (and ``extra``) back to base (or delete it if base lacks it)."""
    for rel in dict.fromkeys([*task.test_files(), *extra]):
        tracked = git(tree, "cat-file", "-e", f"{base}:{rel}", check=False).returncode == 0
        if tracked:
            git(tree, "checkout", base, "--", rel)
        elif (tree / rel).exists() or (tree / rel).is_symlink():
            (tree / rel).unlink()


class TestRun(BaseModel):
    """What one sandboxed test run of a patched tree produced (shared by grading and task building)."""

    apply_method: ApplyMethod = ApplyMethod.none
    apply_log: str = ""
    infra_error: str = ""
    infra_kind: FailureKind = FailureKind.infrastructure  # task_defect when the task's own data is at fault
    timed_out: bool = False
    log: str = ""
    valid: bool = False
    status_map: dict[str, str] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)


def run_task_tests(
    task: Task, model_patch: str, *, timeout_s: float = DEFAULT_GRADING_TIMEOUT_S, workdir: Path | None = None
) -> TestRun:
    """Fresh base tree + `model_patch` (skipped if empty) + test patch, tests run in the sandbox."""
    t0 = time.monotonic()
    out = TestRun()
    tmp = Path(tempfile.mkdtemp(prefix=f"polar-grade-{task.instance_id}-", dir=workdir))
    try:
        try:
            venv = ensure_task_env(task)
            tree = materialize(task, tmp / "testbed")
        except (EnvBuildError, OSError, RuntimeError, ValueError) as e:
            out.infra_error = f"setup: {e}"
            return out
        out.timings["setup_s"] = time.monotonic() - t0
        base = git(tree, "rev-parse", "HEAD").stdout.decode().strip()

        if model_patch.strip():
            t_apply = time.monotonic()
            out.apply_method, out.apply_log = apply_patch(tree, model_patch)
            out.timings["apply_s"] = time.monotonic() - t_apply
            if out.apply_method == ApplyMethod.none:
                return out

        reset_test_files(tree, task, base, agent_test_files(model_patch))
        test_method, test_log = apply_patch(tree, task.test_patch)
        if test_method != ApplyMethod.git_apply:
            out.infra_error = f"test patch did not apply cleanly:\n{test_log[-LOG_TAIL_CHARS:]}"
            out.infra_kind = FailureKind.task_defect
            return out

        prepare_tree_owner(tree)
        env = {k: v.replace("{testbed}", TREE_MOUNT) for k, v in task.environment.env.items()}
        try:
            run = run_sandboxed(eval_script(task), tree=tree, venv=venv, timeout_s=timeout_s, env=env)
        except (SandboxUnavailable, OSError) as e:
            out.infra_error = f"sandbox: {e}"
            return out
        out.timings["tests_s"] = run.seconds
        out.log = run.output
        if run.timed_out:
            out.timed_out = True
            out.log += f"\n{sb.TESTS_TIMEOUT} after {timeout_s:.0f}s\n"
            return out
        if sb.START_TEST_OUTPUT not in out.log:
            # The marker is the first thing the script prints: the sandbox itself never ran.
            out.infra_error = f"sandbox did not start (exit {run.returncode})"
            return out

        log_path = tmp / "test_output.txt"
        log_path.write_text(out.log)
        out.status_map, out.valid = sb.parse_log(
            str(log_path),
            instance_id=task.instance_id,
            repo=task.repo,
            version=task.version,
            fail_to_pass=task.FAIL_TO_PASS,
            pass_to_pass=task.PASS_TO_PASS,
        )
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def grade(
    task: Task,
    model_patch: str | None,
    *,
    timeout_s: float = DEFAULT_GRADING_TIMEOUT_S,
    workdir: Path | None = None,
) -> GradeResult:
    """Grade `model_patch` for `task`. Never raises for agent-caused failures."""
    t0 = time.monotonic()
    result = GradeResult(instance_id=task.instance_id)
    if not task.FAIL_TO_PASS:
        # Nothing would have to change for "all FAIL_TO_PASS pass": refuse to call it resolved.
        return _infra(result, "task has no FAIL_TO_PASS tests: grading would be vacuous", t0,
                      FailureKind.task_defect)
    if not model_patch or not model_patch.strip():
        result.failure_kind = FailureKind.empty_patch
        _finish(result, task, {}, t0)
        return result

    try:
        run = run_task_tests(task, model_patch, timeout_s=timeout_s, workdir=workdir)
    except Exception as e:  # noqa: BLE001 - a grader bug must be masked as infrastructure, not scored 0
        return _infra(result, f"grader error: {type(e).__name__}: {e}", t0)
    result.timings.update(run.timings)
    result.apply_method = run.apply_method
    result.patch_applied = run.apply_method != ApplyMethod.none
    result.log_tail = (run.log or run.apply_log)[-LOG_TAIL_CHARS:]
    if run.infra_error:
        return _infra(result, run.infra_error, t0, run.infra_kind)
    if not result.patch_applied:
        result.failure_kind = FailureKind.apply_failed
    elif run.timed_out:
        result.failure_kind = FailureKind.test_timeout
    elif not run.valid:
        result.failure_kind = FailureKind.test_crash
    else:
        report = sb.tests_report(run.status_map, task.FAIL_TO_PASS, task.PASS_TO_PASS)
        result.resolved = sb.fully_resolved(report)
        result.reward = 1.0 if result.resolved else 0.0
    _finish(result, task, run.status_map, t0)
    return result


def _finish(result: GradeResult, task: Task, status_map: dict[str, str], t0: float) -> None:
    result.fail_to_pass = {t: status_map.get(t, "MISSING") for t in task.FAIL_TO_PASS}
    result.pass_to_pass = {t: status_map.get(t, "MISSING") for t in task.PASS_TO_PASS}
    result.timings["total_s"] = time.monotonic() - t0


def _infra(result: GradeResult, error: str, t0: float,
           kind: FailureKind = FailureKind.infrastructure) -> GradeResult:
    result.failure_kind = kind
    result.error = error
    result.resolved = False
    result.reward = 0.0
    result.timings["total_s"] = time.monotonic() - t0
    return result

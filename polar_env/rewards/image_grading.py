"""Grade a patch inside the task's own image, the way SWE-bench's harness does.

A fresh container of the image (``--network none``, limits, nothing mounted but the forwarder),
``/testbed`` handed to the unprivileged sandbox uid, then, all as that uid (tests never run as root):
``git apply`` the agent's patch (a refusal is the agent's ``apply_failed``), then the eval script:

- a row that carries SWE-bench's evaluation columns (``eval_script``, ``log_parser``,
  ``eval_type``, as swebench 5 datasets do): exactly the script ``swebench``'s ``make_test_spec``
  builds, in the image it names, parsed by its own parser;
- any other row: the same shape built from the task's ``test_cmd``/``test_directives`` (reset the
  test patch's files to base, apply the test patch, run the tests between the harness markers).

This is SWE-bench's procedure (docs/rewards.md calls it the ``swebench`` mode): the test files the
test patch touches are reset, nothing else. The deadline kills everything in the container.
"""

from __future__ import annotations

import asyncio
import shlex
import tempfile
import time
from pathlib import Path

from polar_env.outcomes import FailureKind
from polar_env.rewards import swebench_compat as sb
from polar_env.rewards.grading import LOG_TAIL_CHARS, GradeResult, GradingMode, _finish, _infra, eval_script
from polar_env.rewards.patch import ApplyMethod
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.container import ContainerError, ContainerSandbox
from polar_env.tasks.models import Task

PATCH_INSIDE = "/tmp/polar-model.patch"
GRADING_SPEC = SandboxSpec(memory_bytes=8 << 30, pids_max=4096)


def uses_swebench_spec(task: Task) -> bool:
    return bool(task.eval_script)


def swebench_row(task: Task, image: str) -> dict:
    """The row as swebench's ``make_test_spec`` takes it."""
    return {"instance_id": task.instance_id, "image": image, "repo": task.repo, "version": task.version,
            "FAIL_TO_PASS": task.FAIL_TO_PASS, "PASS_TO_PASS": task.PASS_TO_PASS, "log_parser": task.log_parser,
            "eval_type": task.eval_type, "eval_script": task.eval_script}


def custom_eval_script(task: Task) -> str:
    """SWE-bench's eval-script shape for a row without one: reset the test files to base, apply the
    test patch, run the task's tests between the markers, reset the test files again."""
    base = task.base_commit or "HEAD"
    files = " ".join(shlex.quote(f) for f in task.test_files())
    env = " ".join(f"export {k}={shlex.quote(v.replace('{testbed}', '/testbed'))};"
                   for k, v in task.environment.env.items())
    delim = "EOF_POLAR_TEST_PATCH"
    lines = ["#!/bin/bash", "set -uxo pipefail", "cd /testbed", "git config --global --add safe.directory /testbed"]
    if files:
        lines.append(f"git checkout {shlex.quote(base)} -- {files}")
    lines += [f"git apply -v - <<'{delim}'", task.test_patch.rstrip("\n"), delim,
              "if [ $? -ne 0 ]; then echo 'POLAR: test patch did not apply'; exit 97; fi"]
    if env:
        lines.append(env)
    lines.append(eval_script(task))
    if files:
        lines.append(f"git checkout {shlex.quote(base)} -- {files}")
    return "\n".join(lines) + "\n"


def grading_plan(task: Task, image: str) -> tuple[str, str, object | None]:
    """(image, eval script, swebench TestSpec or None) for grading ``task``."""
    if uses_swebench_spec(task):
        spec = sb.make_test_spec(swebench_row(task, image))
        return spec.image, spec.eval_script, spec
    return image, custom_eval_script(task), None


def grade_in_image(task: Task, model_patch: str | None, *, engine: str, image: str,
                   timeout_s: float = 900.0) -> GradeResult:
    """Grade ``model_patch`` for ``task`` in a fresh container of ``image``. Never raises for agent faults."""
    return asyncio.run(_grade(task, model_patch or "", engine=engine, image=image, timeout_s=timeout_s))


def run_base_in_image(task: Task, *, engine: str, timeout_s: float = 900.0) -> tuple[dict[str, str], str]:
    """(FAIL_TO_PASS/PASS_TO_PASS statuses, infrastructure error) of the tests on the untouched base tree
    (task validation: the empty patch must not pass)."""
    from polar_env.episodes.workspace import task_image

    result = asyncio.run(_grade(task, "", engine=engine, image=task_image(task), timeout_s=timeout_s,
                                base_only=True))
    return {**result.fail_to_pass, **result.pass_to_pass}, result.error


async def _grade(task: Task, patch: str, *, engine: str, image: str, timeout_s: float,
                 base_only: bool = False) -> GradeResult:
    t0 = time.monotonic()
    result = GradeResult(instance_id=task.instance_id, mode=GradingMode.swebench)  # its procedure, only
    if not task.FAIL_TO_PASS:
        return _infra(result, "task has no FAIL_TO_PASS tests: grading would be vacuous", t0, FailureKind.task_defect)
    if not patch.strip() and not base_only:
        result.failure_kind = FailureKind.empty_patch
        _finish(result, task, {}, t0)
        return result
    try:
        image, script, spec = grading_plan(task, image)
    except Exception as exc:  # noqa: BLE001 - a row swebench cannot read is a task defect
        return _infra(result, f"swebench test spec: {type(exc).__name__}: {exc}", t0, FailureKind.task_defect)
    box: ContainerSandbox | None = None
    try:
        box = await asyncio.to_thread(ContainerSandbox.create, None, spec=GRADING_SPEC, image=image, engine=engine)
        result.timings["setup_s"] = time.monotonic() - t0
        with tempfile.TemporaryDirectory(prefix="polar-grade-") as tmp:
            for name, text in (("model.patch", patch), ("eval.sh", script)):
                (Path(tmp) / name).write_text(text, errors="surrogateescape")
            await box.copy_in(Path(tmp) / "model.patch", PATCH_INSIDE)
            await box.copy_in(Path(tmp) / "eval.sh", "/tmp/polar-eval.sh")
            if not base_only:
                applied = await box.run(["git", "apply", "--verbose", PATCH_INSIDE], timeout_s=120)
                result.log_tail = (applied.stdout_tail + applied.stderr_tail)[-LOG_TAIL_CHARS:]
                if applied.exit_code != 0:
                    result.failure_kind = FailureKind.apply_failed
                    _finish(result, task, {}, t0)
                    return result
                result.patch_applied, result.apply_method = True, ApplyMethod.git_apply
            t_tests = time.monotonic()
            run = await box.run(["/bin/bash", "/tmp/polar-eval.sh"], timeout_s=timeout_s, max_output_bytes=8 << 20)
            result.timings["tests_s"] = time.monotonic() - t_tests
            log = run.stdout_tail + run.stderr_tail
            result.log_tail = log[-LOG_TAIL_CHARS:]
            if run.timed_out:
                result.failure_kind = FailureKind.test_timeout
                _finish(result, task, {}, t0)
                return result
            if run.exit_code == 97 and "POLAR: test patch did not apply" in log:
                return _infra(result, f"test patch did not apply cleanly:\n{log[-LOG_TAIL_CHARS:]}", t0,
                              FailureKind.task_defect)
            log_path = Path(tmp) / "test_output.txt"
            log_path.write_text(log)
            if spec is not None:
                status_map, valid = sb.parse_log_with_spec(spec, str(log_path))
            else:
                status_map, valid = sb.parse_log(str(log_path), instance_id=task.instance_id, repo=task.repo,
                                                 version=task.version, fail_to_pass=task.FAIL_TO_PASS,
                                                 pass_to_pass=task.PASS_TO_PASS)
    except (ContainerError, OSError) as exc:
        return _infra(result, f"container: {exc}", t0)
    finally:
        if box is not None:
            await box.destroy()
    if not valid:
        result.failure_kind = FailureKind.test_crash
    else:
        report = sb.tests_report(status_map, task.FAIL_TO_PASS, task.PASS_TO_PASS)
        result.resolved = sb.fully_resolved(report)
        result.reward = 1.0 if result.resolved else 0.0
    _finish(result, task, status_map, t0)
    return result


def grade_task(task: Task, model_patch: str | None, *, kind: str, timeout_s: float = 900.0,
               mode: GradingMode = GradingMode.strict) -> GradeResult:
    """Grade where the task's episodes run: its image for docker/podman, the bubblewrap grader (the
    task's base tree and pinned venv) otherwise. Apptainer has no image grader yet: a task without
    a base archive is then an infrastructure failure, never the agent's."""
    from polar_env.episodes.workspace import task_image
    from polar_env.rewards.grading import grade

    if task.harbor is not None and kind in ("docker", "podman"):
        from polar_env.rewards.harbor_verifier import grade_patch

        return grade_patch(task, model_patch or "", engine=kind)
    if kind in ("docker", "podman"):
        return grade_in_image(task, model_patch, engine=kind, image=task_image(task), timeout_s=timeout_s)
    if not task.base_archive:
        return _infra(GradeResult(instance_id=task.instance_id),
                      f"no grader for {kind} without a base archive: grade with --sandbox podman|docker",
                      time.monotonic())
    return grade(task, model_patch, timeout_s=timeout_s, mode=mode)

"""Grade a patch inside the task's own image, the way SWE-bench's harness does.

A fresh container of the image (``--network none``, limits, nothing mounted but the forwarder), the
task's tree (its ``workdir``: ``/testbed`` for SWE-bench's images, ``/<repo>`` for SWE-rebench V2's...)
handed to the unprivileged sandbox uid, then, all as that uid (tests never run as root):
``git apply`` the agent's patch (a refusal is the agent's ``apply_failed``), then the eval script:

- a row that carries SWE-bench's evaluation columns (``eval_script``, ``log_parser``,
  ``eval_type``, as swebench 5 datasets do): exactly the script ``swebench``'s ``make_test_spec``
  builds, in the image it names, parsed by its own parser;
- any other row: the same shape built from the task's ``test_cmd``/``test_directives`` (reset the
  test patch's files to base, apply the test patch, run the tests between the harness markers).

This is SWE-bench's procedure (docs/rewards.md calls it the ``swebench`` mode): the test files the
test patch touches are reset, nothing else. The deadline kills everything in the container.

For a pytest task the ``strict`` mode runs too, in a second fresh container (`image_strict`): the
allowed-path reset, the grader's runner and result stream, canaries, the gold patch's run in the
same image as evidence, and every tampering flag scoring 0. It is the record's verdict, as in
bubblewrap grading; ``swebench`` stays beside it in ``modes``.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from polar_env.outcomes import FailureKind
from polar_env.rewards import swebench_compat as sb
from polar_env.rewards.flags import zero_if_tampered
from polar_env.rewards.gold_runs import gold_key, gold_run
from polar_env.rewards.grading import (
    CONTROL_UNSURE,
    LOG_TAIL_CHARS,
    GradeResult,
    GradingMode,
    ModeResult,
    TestRun,
    _finish,
    _infra,
    _mode_result,
    against_gold,
    eval_script,
    gold_notes,
    perturbed_check,
    tested_code_crash,
)
from polar_env.rewards.image_strict import (
    ImageBox,
    StrictImageError,
    TestPatchFailed,
    perturbed_in_box,
    strict_in_box,
)
from polar_env.rewards.patch import ApplyMethod
from polar_env.rewards.sandbox_exec import grading_timeout_s
from polar_env.rewards.strict_run import StrictUnsupported, perturbed_disagreement, pytest_args
from polar_env.sandbox.apptainer import ENGINE as APPTAINER
from polar_env.sandbox.apptainer import ApptainerBox, is_apptainer_image
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.container import (
    ContainerError,
    ContainerSandbox,
    copy_out_of_image,
    engine_run,
    label_args,
)
from polar_env.sandbox.warm_images import warm_image
from polar_env.tasks.answers import answer_free_image
from polar_env.tasks.base_trees import apptainer_base
from polar_env.tasks.datasets import procedure_of
from polar_env.tasks.models import Task
from polar_env.tasks.runtime import (
    WorkspaceUnavailable,
    check_hidden,
    hidden_paths,
    history_target,
    task_image,
)

INPUT_INSIDE = "/tmp/polar-input"  # the grader's inputs (a dir a box keeps between execs: `provide`)
PATCH_INSIDE = f"{INPUT_INSIDE}/model.patch"
EVAL_INSIDE = f"{INPUT_INSIDE}/eval.sh"
GRADING_SPEC = SandboxSpec(memory_bytes=8 << 30, pids_max=4096)


def grading_spec(task: Task) -> SandboxSpec:
    """The grading box's spec: the task's tree at its workdir."""
    return replace(GRADING_SPEC, workdir=task.workdir)


def uses_swebench_spec(task: Task) -> bool:
    return bool(task.eval_script)


def swebench_row(task: Task, image: str) -> dict:
    """The row as swebench's ``make_test_spec`` takes it."""
    return {
        "instance_id": task.instance_id,
        "image": image,
        "repo": task.repo,
        "version": task.version,
        "FAIL_TO_PASS": task.FAIL_TO_PASS,
        "PASS_TO_PASS": task.PASS_TO_PASS,
        "log_parser": task.log_parser,
        "eval_type": task.eval_type,
        "eval_script": task.eval_script,
    }


def custom_eval_script(task: Task) -> str:
    """SWE-bench's eval-script shape for a row without one: the task environment activated the way its
    dataset's harness does it (`Procedure.activate`), reset the test files to base, apply the test patch,
    run the task's tests between the markers, reset the test files again; where the test command applies the
    patches itself (`Procedure.patch_path`: Multi-SWE-bench's ``fix-run.sh``), the command alone."""
    base, tree = task.base_commit or "HEAD", shlex.quote(task.workdir)
    procedure = procedure_of(task)
    own = bool(procedure.patch_path)
    files = "" if own else " ".join(shlex.quote(f) for f in task.test_files())
    env = " ".join(
        f"export {k}={shlex.quote(v.replace('{testbed}', task.workdir))};"
        for k, v in task.environment.env.items()
    )
    delim = "EOF_POLAR_TEST_PATCH"
    activate = procedure.activate
    lines = [
        "#!/bin/bash",
        "set -uxo pipefail",
        *([activate] if activate else []),
        f"cd {tree}",
        f"git config --global --add safe.directory {tree}",
    ]
    if files:
        lines.append(f"git checkout {shlex.quote(base)} -- {files}")
    if task.test_patch.strip() and not own:  # none: the tests are in its image (R2E-Gym's, SWE-smith's)
        lines += [
            f"git apply -v - <<'{delim}'",
            task.test_patch.rstrip("\n"),
            delim,
            "if [ $? -ne 0 ]; then echo 'POLAR: test patch did not apply'; exit 97; fi",
        ]
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
        return image if is_apptainer_image(image) else spec.image, spec.eval_script, spec
    return image, custom_eval_script(task), None


def image_box(engine: str, image: str, task: Task) -> ImageBox:
    """A fresh box of ``image`` to grade ``task`` in: a container of its warm image (its git history reduced
    to the task's base, the tree the sandbox uid's and its base recorded once per node, as for episodes: the
    tested code reads no more history than the agent did, nor any copy of the answer the episode's image was
    pruned of (`answers.answer_free_image`); on podman as root the tree on a disk quota), or on
    apptainer a box over a copy of the image's own tree (copied out and reduced once per node:
    `tasks.base_trees.apptainer_base`)."""
    target, spec = history_target(task), grading_spec(task)
    if engine == APPTAINER:
        check_hidden(task, engine)
        tree = apptainer_base(image, spec, target)
        return ApptainerBox.create(image, spec=spec, base_tree=tree.tree, base_git=tree.git_dir)
    return ContainerSandbox.create(
        None,
        spec=spec,
        image=answer_free_image(
            task, engine, warm_image(engine, image, spec, target, hidden_paths(task)), spec
        ),
        engine=engine,
        warm=True,
    )


def fresh_image_argv(engine: str, image: str, bind: str = "") -> list[str]:
    """argv prefix: a command in a fresh container of ``image`` (never one the agent ran in), as root, with no
    network; ``bind`` (``host:inside``) the one directory it sees of the host."""
    if engine == APPTAINER:
        return [APPTAINER, "exec", "--containall", *(["--bind", bind] if bind else []), image]
    mount = ["-v", bind] if bind else []
    return [engine, "run", "--rm", *label_args(), "--network", "none", "--user", "0", *mount, image]


def run_script_parser(task: Task, engine: str, image: str, log: str) -> dict[str, str]:
    """The tests' statuses as the dataset's own parser script reads them (`Procedure.script_parser`, SWE-bench
    Pro's ``parser.py``), run as its harness runs it, ``python <parser> <stdout> <stderr> <output.json>``,
    on the test command's output, in a fresh container of the original ``image``: nothing the tested code
    wrote is there."""
    start, end = log.find(sb.START_TEST_OUTPUT), log.rfind(sb.END_TEST_OUTPUT)
    output = log[start + len(sb.START_TEST_OUTPUT) : end] if 0 <= start < end else log
    with tempfile.TemporaryDirectory(prefix="polar-parse-") as tmp:
        (Path(tmp) / "stdout.log").write_text(output, errors="surrogateescape")
        (Path(tmp) / "stderr.log").write_text("")
        (Path(tmp) / "parser.py").write_text(task.grader_files[procedure_of(task).script_parser])
        inside = "/polar-parse"
        engine_run(
            [
                *fresh_image_argv(engine, image, f"{tmp}:{inside}"),
                "python",
                f"{inside}/parser.py",
                *(f"{inside}/{name}" for name in ("stdout.log", "stderr.log", "output.json")),
            ],
            timeout_s=300,
        )
        found = json.loads((Path(tmp) / "output.json").read_text())
    return {str(t["name"]): str(t["status"]) for t in found.get("tests", [])}


# (engine, image, task) -> the test patch its dataset keeps in the image: read once per process
_image_tests: dict[tuple[str, str, str], str] = {}


def with_image_tests(task: Task, engine: str, image: str) -> Task:
    """``task`` with the test patch its dataset keeps in its original ``image`` (`Procedure.image_tests`:
    SWE-smith's tests at the instance branch's ``HEAD~1``), printed by the image's git as root in a
    container of it with no network, never one the agent ran in; ``task`` itself where there is none."""
    argv = procedure_of(task).image_tests
    if argv is None or task.test_patch:
        return task
    known = (engine, image, task.instance_id)
    if known not in _image_tests:
        run = fresh_image_argv(engine, image)
        text = engine_run([*run, "sh", "-c", *argv(task)], timeout_s=300).decode("utf-8", "surrogateescape")
        if not text.strip():
            raise ContainerError(f"no test file of {task.instance_id} differs at its branch's HEAD~1")
        _image_tests[known] = text
    return task.model_copy(update={"test_patch": _image_tests[known]})


async def place_dataset_files(task: Task, box: ImageBox, engine: str, image: str, patch: str = "") -> None:
    """The files the task's dataset runs its tests with, where they read them, whatever the agent put there
    removed first, then locked (the tested code cannot change them): those it keeps from the agent
    (`Procedure.hidden`), copied from its original ``image``, those from beside its rows
    (`Task.grader_files`), and the ``patch`` under test where the test command applies it itself
    (`Procedure.patch_path`)."""
    procedure = procedure_of(task)
    placed = {src: dest for src, dest in procedure.hidden_paths(task).items() if dest}
    texts = {**task.grader_files, **({procedure.patch_path: patch} if procedure.patch_path else {})}
    dests = [*placed.values(), *texts]
    if not dests:
        return
    # the directories made for the row's files (Pro's /workspace): an apptainer box binds one there
    made = sorted({str(Path(d).parent) for d in task.grader_files} - {"/", task.workdir})
    for inside in made:
        await box.provide(inside)
    with tempfile.TemporaryDirectory(prefix="polar-dataset-files-") as tmp:
        if placed:  # dest/<i>, in the order of ``dests``
            await asyncio.to_thread(copy_out_of_image, engine, image, list(placed), Path(tmp))
        for i, text in enumerate(texts.values(), start=len(placed)):
            (Path(tmp) / str(i)).write_text(text, errors="surrogateescape")
        clear = 'for p; do rm -rf -- "$p" && mkdir -p -- "$(dirname -- "$p")" || exit 1; done'
        cleared = await box.run(["sh", "-c", clear, "sh", *dests], user="0", timeout_s=300)
        if cleared.exit_code != 0:
            raise ContainerError(f"clearing {', '.join(dests)}: {cleared.stderr_tail[-300:]}")
        for i, dest in enumerate(dests):
            await box.copy_in(Path(tmp) / str(i), dest)
    await box.lock([*dests, *made])  # those directories too: nothing in them renamed or replaced meanwhile


def grade_in_image(
    task: Task,
    model_patch: str | None,
    *,
    engine: str,
    image: str,
    timeout_s: float | None = None,
    mode: GradingMode = GradingMode.strict,
) -> GradeResult:
    """Grade ``model_patch`` for ``task`` in fresh containers of ``image`` (both modes; the verdict is
    ``mode``'s, strict where the task runs pytest). Never raises for agent faults."""
    timeout_s = grading_timeout_s(timeout_s)  # None: the configured deadline, for both stages
    try:
        task = with_image_tests(task, engine, image)
    except (ContainerError, OSError) as exc:
        return _infra(
            GradeResult(instance_id=task.instance_id), f"its tests in {image}: {exc}", time.monotonic()
        )
    result = asyncio.run(_grade(task, model_patch or "", engine=engine, image=image, timeout_s=timeout_s))
    try:
        pytest_args(task)
    except StrictUnsupported:
        return result  # not pytest: SWE-bench's procedure is all there is
    # the swebench script's test patch refused on the patched tree: the strict stage's gold run says
    # whether it applies to the image's base (then it is the patch's 0, else the task's defect)
    refused_tp = result.failure_kind == FailureKind.task_defect and result.error.startswith(
        "test patch did not apply"
    )
    if (result.is_infrastructure_failure and not refused_tp) or result.failure_kind in (
        FailureKind.empty_patch,
        FailureKind.apply_failed,
    ):
        return result
    t0 = time.monotonic()
    swebench = ModeResult(
        resolved=result.resolved,
        reward=result.reward,
        failure_kind=result.failure_kind,
        fail_to_pass=result.fail_to_pass,
        pass_to_pass=result.pass_to_pass,
        error=result.error,
        tests_s=result.timings.get("tests_s", 0.0),
    )
    if refused_tp:
        swebench = ModeResult(
            failure_kind=FailureKind.test_crash,
            error=f"{result.error[:1500]}\n(on the patched "
            "tree; the gold run in this image applied it: the patch's doing)",
        )
    try:
        strict, evidence, reset = asyncio.run(
            _strict(task, model_patch or "", engine=engine, image=image, timeout_s=timeout_s)
        )
    except StrictImageError as e:
        return _infra(
            result,
            f"strict: {e}"[:2000],
            t0,
            FailureKind.task_defect if e.task_defect else FailureKind.infrastructure,
        )
    except (ContainerError, OSError) as e:
        return _infra(result, f"container: {e}", t0)
    except Exception as e:  # noqa: BLE001 - the patched tests already ran in this image (swebench above)
        return tested_code_crash(
            result, f"strict: grader error after the tests ran: {type(e).__name__}: {e}", t0
        )
    result.modes = {GradingMode.strict: strict, GradingMode.swebench: swebench}
    result.flags, result.flag_evidence, result.reset_paths = sorted(evidence), evidence, reset
    result.mode = mode
    zero_if_tampered(result)
    chosen = result.modes[mode]
    result.resolved, result.reward, result.failure_kind = chosen.resolved, chosen.reward, chosen.failure_kind
    result.error, result.fail_to_pass, result.pass_to_pass = (
        chosen.error,
        chosen.fail_to_pass,
        chosen.pass_to_pass,
    )
    result.timings["tests_strict_s"] = strict.tests_s
    if strict.reward != swebench.reward:
        result.disagreement = strict.error or "strict runs the tests the grader's way"
    return result


async def _strict_run(
    task: Task, patch: str, *, engine: str, image: str, timeout_s: float, gold: TestRun | None = None
) -> dict:
    """The strict run in a fresh container; with ``gold``, judged against it, and perturbed if it resolves
    (where the gold patch passes the perturbed run); without, the gold run itself and its perturbed
    control."""
    box = await asyncio.to_thread(image_box, engine, image, task)
    try:
        try:
            done = await strict_in_box(task, box, patch, timeout_s)
        except TestPatchFailed as e:
            if gold is None:
                raise  # the gold tree: a task defect
            return {
                "test_patch_failed": (
                    f"the {e} on the patched tree, while the gold run's applied: the patch's doing"
                )
            }
        run = done.get("run")
        if gold is None and run is not None and run.valid:
            found = (
                perturbed_disagreement(await perturbed_in_box(task, box, timeout_s))
                if _mode_result(task, run).resolved
                else ["the gold patch does not resolve"]
            )
            if any(f.startswith(CONTROL_UNSURE) for f in found):  # says nothing of the gold patch: not cached
                raise StrictImageError(f"the gold patch's perturbed control: {'; '.join(found)}"[:600])
            run.perturbed_control = "; ".join(found)
        if gold is not None and run is not None and not run.timed_out:
            found = against_gold(task, run, gold)
            run.notes.update(gold_notes(task, run, gold))
            if not found and _mode_result(task, run).resolved and perturbed_check(task, run, gold):
                found = perturbed_disagreement(await perturbed_in_box(task, box, timeout_s))
            if found:
                run.violations += found
                run.valid, run.error = False, "; ".join(run.violations)
        return done
    finally:
        await box.destroy()


async def _strict(
    task: Task, patch: str, *, engine: str, image: str, timeout_s: float
) -> tuple[ModeResult, dict[str, str], dict[str, str]]:
    """The strict mode in the image, judged against the gold patch's strict run in the same image."""

    def run_gold() -> TestRun:  # on a thread of its own, its own loop: the key's lock may be held meanwhile
        return asyncio.run(_strict_run(task, task.patch, engine=engine, image=image, timeout_s=timeout_s))[
            "run"
        ]

    gold = await asyncio.to_thread(
        gold_run, gold_key(task, f"image:{image}"), TestRun, run_gold, keep=lambda run: run.valid
    )
    if not gold.valid:
        raise StrictImageError(
            f"the gold patch has no valid strict run in the image: {gold.error}"[:600], task_defect=True
        )
    done = await _strict_run(task, patch, engine=engine, image=image, timeout_s=timeout_s, gold=gold)
    if "refused" in done:
        return (
            ModeResult(failure_kind=FailureKind.apply_failed, error=done["refused"]),
            {"patch-refused": ""},
            {},
        )
    if "test_patch_failed" in done:
        return ModeResult(failure_kind=FailureKind.test_crash, error=done["test_patch_failed"][:2000]), {}, {}
    run: TestRun = done["run"]
    evidence = dict(done["flags"])
    evidence.update({f"reset:{r}": p for p, r in done["reset_paths"].items()})
    for v in run.violations:
        evidence.setdefault(v.split(":")[0], v)
    evidence.update(run.notes)
    if run.untrusted_xfail:
        evidence.setdefault("untrusted-xfail", ", ".join(run.untrusted_xfail[:3]))
    return _mode_result(task, run), evidence, done["reset_paths"]


def run_base_in_image(
    task: Task, *, engine: str, timeout_s: float | None = None
) -> tuple[dict[str, str], str]:
    """(FAIL_TO_PASS/PASS_TO_PASS statuses, infrastructure error) of the tests on the untouched base tree
    (task validation: the empty patch must not pass)."""
    try:
        task = with_image_tests(task, engine, task_image(task))
    except (ContainerError, OSError) as exc:
        return {}, f"its tests in {task_image(task)}: {exc}"
    result = asyncio.run(
        _grade(
            task,
            "",
            engine=engine,
            image=task_image(task),
            timeout_s=grading_timeout_s(timeout_s),
            base_only=True,
        )
    )
    return {**result.fail_to_pass, **result.pass_to_pass}, result.error


async def _grade(
    task: Task, patch: str, *, engine: str, image: str, timeout_s: float, base_only: bool = False
) -> GradeResult:
    t0 = time.monotonic()
    result = GradeResult(instance_id=task.instance_id, mode=GradingMode.swebench)  # its procedure, only
    if not task.FAIL_TO_PASS:
        return _infra(
            result, "task has no FAIL_TO_PASS tests: grading would be vacuous", t0, FailureKind.task_defect
        )
    if not patch.strip() and not base_only:
        result.failure_kind = FailureKind.empty_patch
        _finish(result, task, {}, t0)
        return result
    procedure = procedure_of(task)
    if not procedure.gradable:
        return _infra(result, f"{task.dataset}: {procedure.instead}", t0, FailureKind.task_defect)
    if base_only and procedure.base_test_cmd:  # its own command for the base with the tests applied
        task = task.model_copy(update={"test_cmd": procedure.base_test_cmd})
    try:
        image, script, spec = grading_plan(task, image)
    except Exception as exc:  # noqa: BLE001 - a row swebench cannot read is a task defect
        return _infra(result, f"swebench test spec: {type(exc).__name__}: {exc}", t0, FailureKind.task_defect)
    box: ImageBox | None = None
    try:
        box = await asyncio.to_thread(image_box, engine, image, task)
        result.timings["setup_s"] = time.monotonic() - t0
        with tempfile.TemporaryDirectory(prefix="polar-grade-") as tmp:
            for name, text in (("model.patch", patch), ("eval.sh", script)):
                (Path(tmp) / name).write_text(text, errors="surrogateescape")
            await box.provide(INPUT_INSIDE)
            await box.copy_in(Path(tmp) / "model.patch", PATCH_INSIDE)
            await box.copy_in(Path(tmp) / "eval.sh", EVAL_INSIDE)
            if not base_only:  # where the test command applies the patch itself, checked here only
                check = ["--check"] if procedure.patch_path else []
                applied = await box.run(["git", "apply", "--verbose", *check, PATCH_INSIDE], timeout_s=120)
                result.log_tail = (applied.stdout_tail + applied.stderr_tail)[-LOG_TAIL_CHARS:]
                if applied.exit_code != 0:
                    result.failure_kind = FailureKind.apply_failed
                    _finish(result, task, {}, t0)
                    return result
                result.patch_applied, result.apply_method = True, ApplyMethod.git_apply
            await place_dataset_files(task, box, engine, image, patch)
            t_tests = time.monotonic()
            run = await box.run(["/bin/bash", EVAL_INSIDE], timeout_s=timeout_s, max_output_bytes=8 << 20)
            result.timings["tests_s"] = time.monotonic() - t_tests
            log = run.stdout_tail + run.stderr_tail
            result.log_tail = log[-LOG_TAIL_CHARS:]
            if run.timed_out:
                result.failure_kind = FailureKind.test_timeout
                _finish(result, task, {}, t0)
                return result
            if run.exit_code == 97 and "POLAR: test patch did not apply" in log:
                return _infra(
                    result,
                    f"test patch did not apply cleanly:\n{log[-LOG_TAIL_CHARS:]}",
                    t0,
                    FailureKind.task_defect,
                )
            log_path = Path(tmp) / "test_output.txt"
            log_path.write_text(log)
            try:
                if spec is not None:
                    status_map, valid = sb.parse_log_with_spec(spec, str(log_path))
                elif own_parser := procedure.parser(task):
                    status_map, valid = own_parser(log), sb.END_TEST_OUTPUT in log
                elif procedure.script_parser:
                    status_map = await asyncio.to_thread(run_script_parser, task, engine, image, log)
                    valid = sb.END_TEST_OUTPUT in log
                else:
                    status_map, valid = sb.parse_log(
                        str(log_path),
                        instance_id=task.instance_id,
                        repo=task.repo,
                        version=task.version,
                        fail_to_pass=task.FAIL_TO_PASS,
                        pass_to_pass=task.PASS_TO_PASS,
                        log_parser=task.log_parser,
                    )
            except Exception as exc:  # noqa: BLE001 - the log is the tested code's output: the patch's 0
                status_map, valid = {}, False
                result.error = f"log parser: {type(exc).__name__}: {exc}"[:500]
    except (ContainerError, OSError, WorkspaceUnavailable) as exc:
        return _infra(result, f"container: {exc}", t0)
    finally:
        if box is not None:
            await box.destroy()
    if not valid:
        result.failure_kind = FailureKind.test_crash
    elif procedure.resolves is not None:
        result.resolved = procedure.resolves(status_map, task)
    else:
        result.resolved = sb.fully_resolved(sb.tests_report(status_map, task.FAIL_TO_PASS, task.PASS_TO_PASS))
    result.reward = 1.0 if result.resolved else 0.0
    _finish(result, task, status_map, t0)
    return result

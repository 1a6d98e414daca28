"""Grade one agent patch against one task, in two modes reported side by side (docs/rewards.md).

Fresh copy of the base tree -> `git apply` the agent patch (refusals are the agent's failure) ->
then per mode:

- ``strict`` (the training reward): restore every changed path that is not project source
  (`path_policy`) and apply the test patch; run pytest the grader's way, read per-test outcomes
  from the grader plugin's result stream, and believe them only if they agree with the runner and
  its canaries (`strict_run`) and with the gold run (`gold_reference`: the same ids collected, every
  test the gold run passed still passing), and if the F2P tests pass again when perturbed
  (`run_perturbed`). Any tampering flag (`flags`, the run's own findings) scores 0.
- ``swebench`` (numbers comparable with published pass@1): SWE-bench's procedure — reset only the
  test patch's files, run the test command between the harness markers, parse the log with the
  pinned ``swebench`` package's parser.

Resolved iff every FAIL_TO_PASS test passes and no PASS_TO_PASS test breaks (SWE-bench's own
report functions in both modes). Failures that are not the agent's (sandbox, env, task data) are
`infrastructure` / `task_defect` (polar_env.outcomes), masked instead of punishing the policy.
Which it is, is the supervisor's evidence, never the tested process's output: a sandbox that
never reported its start (`sandbox_exec`) is infrastructure only if the base tree's sandbox does
not start either; if the base's starts, the patched tree broke it (`patch_broke_sandbox`, 0). A
sandbox that started ran tested code: whatever it printed, no valid result is the patch's.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
import time
from functools import partial
from pathlib import Path

from pydantic import BaseModel, Field

from polar_env.grades import ApplyMethod, GradeResult, GradingMode, ModeResult
from polar_env.outcomes import FailureKind
from polar_env.rewards import swebench_compat as sb
from polar_env.rewards.flags import tampering_flags, zero_if_tampered
from polar_env.rewards.gold_runs import gold_key, gold_run
from polar_env.rewards.path_policy import non_source_reason
from polar_env.rewards.sandbox_exec import (
    TREE_MOUNT,
    SandboxUnavailable,
    grading_timeout_s,
    prepare_tree_owner,
    run_sandboxed,
)
from polar_env.rewards.strict_run import (
    PASSING,
    StrictUnsupported,
    perturbed_disagreement,
    run_perturbed,
    run_strict,
)
from polar_env.rewards.workspace import GradingTree, PatchRefused, path_budget_refusal
from polar_env.sandbox import beneath
from polar_env.sandbox.output import OutputStats
from polar_env.tasks.base_trees import base_key
from polar_env.tasks.env import EnvBuildError, ensure_task_env
from polar_env.tasks.models import Task

LOG_TAIL_CHARS = 4000


def eval_script(task: Task) -> str:
    """SWE-bench's script: test command between the harness markers, exit code after."""
    return "\n".join(
        [
            f"echo {shlex.quote(sb.START_TEST_OUTPUT)}",
            task.full_test_command(),
            "rc=$?",
            f"echo {shlex.quote(sb.END_TEST_OUTPUT)}",
            f'echo "{sb.TEST_EXIT_CODE}: $rc"',
        ]
    )


class TestRun(BaseModel):
    """What one sandboxed test run of a patched tree produced (shared by grading and task building)."""

    apply_method: ApplyMethod = ApplyMethod.none
    apply_log: str = ""
    infra_error: str = ""
    infra_kind: FailureKind = FailureKind.infrastructure  # task_defect when the task's own data is at fault
    broke_sandbox: str = (
        ""  # the patched tree's sandbox did not start while the base's does (what bwrap said)
    )
    timed_out: bool = False
    log: str = ""
    valid: bool = False
    error: str = ""  # why a run that finished cannot be believed (strict: report violations)
    violations: list[str] = Field(default_factory=list)
    untrusted_xfail: list[str] = Field(default_factory=list)
    status_map: dict[str, str] = Field(default_factory=dict)
    collected: list[str] = Field(default_factory=list)  # strict: node ids the run collected
    output: OutputStats = Field(default_factory=OutputStats)
    seconds: float = 0.0
    notes: dict[str, str] = Field(default_factory=dict)  # note:* flags (not tampering, flags.is_tamper)
    # a gold run's perturbed control: None not run, "" the gold patch passes the perturbed run, else why not
    perturbed_control: str | None = None
    runner: dict[str, str] = Field(
        default_factory=dict
    )  # strict: the report pipeline's content (`_State.runner`)


class AppliedPatch(BaseModel):
    """The agent patch on a fresh base copy, and what the grader made of the tree."""

    apply_method: ApplyMethod = ApplyMethod.none
    apply_log: str = ""
    refused: str = ""
    changes: dict[str, str] = Field(default_factory=dict)  # path -> new git mode
    reset_paths: dict[str, str] = Field(default_factory=dict)
    source_diff: str = ""


def apply_agent_patch(task: Task, gtree: GradingTree, model_patch: str) -> AppliedPatch:
    """`git apply` only; then classify every changed path of the resulting tree."""
    out = AppliedPatch()
    if not model_patch.strip():
        return out
    allow_binary = "GIT binary patch" in task.patch
    try:
        out.apply_log = gtree.apply(model_patch, allow_binary=allow_binary)
        out.apply_method = ApplyMethod.git_apply
        out.changes = gtree.changes()
        if too_many := path_budget_refusal(out.changes):
            raise PatchRefused(too_many)
        gtree.check_links(out.changes)
    except PatchRefused as e:
        out.apply_method, out.refused = ApplyMethod.none, str(e)
        return out
    roots = gtree.import_roots(task)
    for path in out.changes:
        reason = non_source_reason(path, roots)
        if reason:
            out.reset_paths[path] = reason
    kept = [p for p in out.changes if p not in out.reset_paths]
    if kept:
        out.source_diff = gtree.git(
            "diff", "--no-ext-diff", "--no-color", gtree.base, "--", *kept, check=False
        ).stdout.decode("utf-8", "replace")
        # `git diff <base>` lists no file the base lacks (nothing is staged): a new module is read whole,
        # or every static flag would miss code the patch puts in a file of its own
        in_base = set(
            gtree.git("ls-tree", "-r", "-z", "--name-only", gtree.base, "--", *kept, check=False)
            .stdout.decode("utf-8", "surrogateescape")
            .split("\0")
        )
        for path in kept:
            if path not in in_base and (data := beneath.read(gtree.tree, path)) is not None:
                out.source_diff += added_file(path, data)
    return out


def added_file(path: str, data: bytes) -> str:
    """A new file as a diff of added lines, for the static flags."""
    lines = data.decode("utf-8", "replace").splitlines()
    return f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n" + "".join(
        f"+{line}\n" for line in lines
    )


def _prepare_mode(task: Task, gtree: GradingTree, applied: AppliedPatch, mode: GradingMode) -> str:
    """Reset for ``mode`` and apply the test patch; returns why the task cannot be graded, or "".

    Raises PatchRefused where the final tree holds a link that leaves it (`check_links_after_reset`)."""
    test_files = task.test_files()
    resets = [*test_files, *applied.reset_paths] if mode == GradingMode.strict else test_files
    gtree.restore(list(dict.fromkeys(resets)))
    try:
        gtree.apply(task.test_patch, allow_binary=True)
    except PatchRefused as e:
        return f"test patch did not apply cleanly:\n{str(e)[-LOG_TAIL_CHARS:]}"
    gtree.check_links_after_reset()
    prepare_tree_owner(gtree.tree)
    return ""


def _run_mode(task: Task, tree: Path, venv: Path, mode: GradingMode, timeout_s: float, tmp: Path) -> TestRun:
    env = {k: v.replace("{testbed}", TREE_MOUNT) for k, v in task.environment.env.items()}
    out = TestRun()
    try:
        try:
            if mode != GradingMode.strict:
                raise StrictUnsupported(mode)
            run, outcome = run_strict(task, tree, venv, env, timeout_s)
        except StrictUnsupported:
            # Not pytest (or swebench mode): SWE-bench's script and log parser (strict keeps its reset).
            run, outcome = (
                run_sandboxed(eval_script(task), tree=tree, venv=venv, timeout_s=timeout_s, env=env),
                None,
            )
    except (SandboxUnavailable, OSError) as e:
        out.infra_error = f"sandbox: {e}"
        return out
    out.seconds, out.log, out.output = run.seconds, run.output, run.stats
    if not run.started and not run.timed_out:
        said = run.output.strip()[:300]
        if _base_starts(task, venv, writable=mode != GradingMode.strict):
            out.broke_sandbox = (
                f"the patched tree's sandbox did not start (exit {run.returncode}), the base's does: {said}"
            )
        else:
            out.infra_error = f"sandbox did not start (exit {run.returncode}): {said}"
        return out
    if run.timed_out:
        out.timed_out = True
        out.log += f"\n{sb.TESTS_TIMEOUT} after {timeout_s:.0f}s\n"
        return out
    if outcome is not None:
        out.status_map, out.valid = outcome.status_map, outcome.valid
        out.violations, out.error = outcome.violations, outcome.error or "; ".join(outcome.violations)
        out.untrusted_xfail, out.collected, out.runner = (
            outcome.untrusted_xfail,
            outcome.collected,
            outcome.runner,
        )
        return out
    log_path = tmp / "test_output.txt"
    log_path.write_text(out.log)
    try:
        out.status_map, out.valid = sb.parse_log(
            str(log_path),
            instance_id=task.instance_id,
            repo=task.repo,
            version=task.version,
            fail_to_pass=task.FAIL_TO_PASS,
            pass_to_pass=task.PASS_TO_PASS,
        )
    except Exception as e:  # noqa: BLE001 - the log is the tested code's output: no result, the patch's
        out.status_map, out.valid, out.error = {}, False, f"log parser: {type(e).__name__}: {e}"[:500]
    return out


def _base_starts(task: Task, venv: Path, *, writable: bool) -> bool:
    """Whether the grading sandbox starts on the task's base tree (the control for a patched tree's start)."""
    with tempfile.TemporaryDirectory(prefix=f"polar-base-start-{task.instance_id}-") as tmp:
        base = GradingTree.fresh(task, Path(tmp))
        prepare_tree_owner(base.tree)
        try:
            return run_sandboxed(
                ["true"], tree=base.tree, venv=venv, timeout_s=60, tree_writable=writable
            ).started
        except (SandboxUnavailable, OSError):
            return False


def run_task_tests(
    task: Task,
    model_patch: str,
    *,
    mode: GradingMode = GradingMode.swebench,
    timeout_s: float | None = None,
    workdir: Path | None = None,
    perturb: bool = False,
) -> TestRun:
    """Fresh base copy + `model_patch` (skipped if empty) + test patch, tests run in ``mode``.

    ``perturb`` (strict): also run the perturbed F2P run as a control (`TestRun.perturbed_control`);
    ``timeout_s`` None: the configured deadline (`grading_timeout_s`)."""
    timeout_s = grading_timeout_s(timeout_s)
    with tempfile.TemporaryDirectory(prefix=f"polar-grade-{task.instance_id}-", dir=workdir) as tmp:
        try:
            venv = ensure_task_env(task)
            gtree = GradingTree.fresh(task, Path(tmp))
        except (EnvBuildError, OSError, RuntimeError, ValueError) as e:
            return TestRun(infra_error=f"setup: {e}")
        applied = apply_agent_patch(task, gtree, model_patch)
        if applied.refused:
            return TestRun(apply_log=applied.refused)
        try:
            defect = _prepare_mode(task, gtree, applied, mode)
        except PatchRefused as e:
            return TestRun(apply_log=str(e))
        if defect:
            return TestRun(infra_error=defect, infra_kind=FailureKind.task_defect)
        run = _run_mode(task, gtree.tree, venv, mode, timeout_s, Path(tmp))
        run.apply_method, run.apply_log = applied.apply_method, applied.apply_log
        if perturb and run.valid:
            found = (
                perturbed_findings(task, gtree.tree, venv, timeout_s)
                if _mode_result(task, run).resolved
                else ["the gold patch does not resolve"]
            )
            if any(f.startswith(CONTROL_UNSURE) for f in found):  # says nothing of the gold patch: not cached
                run.valid, run.infra_error = (
                    False,
                    f"the gold patch's perturbed control: {'; '.join(found)}"[:600],
                )
            run.perturbed_control = "; ".join(found)
        return run


# a perturbed control that ended so says nothing of the gold patch (a sandbox fault, a loaded machine):
# not a reason to skip every patch's check, so the gold run is not believed (masked, not cached)
CONTROL_UNSURE = ("perturbed-run: sandbox:", "perturbed-run: timed out")


def gold_reference(task: Task, timeout_s: float | None = None) -> TestRun:
    """The gold patch's strict run (once per task and node: `gold_runs`): the ids a run must collect and
    the statuses it must reproduce, and whether the gold patch itself passes the perturbed F2P run (the
    control: renaming can break honest tests). Evidence the graded tree cannot influence."""
    return gold_run(
        gold_key(task, f"tree:{base_key(task)}"),
        TestRun,
        partial(run_task_tests, task, task.patch, mode=GradingMode.strict, timeout_s=timeout_s, perturb=True),
        keep=lambda run: run.valid and not run.infra_error,
    )  # a sandbox hiccup must not stick


def against_gold(task: Task, run: TestRun, gold: TestRun) -> list[str]:
    """Violations of the gold run's evidence: graded (F2P/P2P) results for ids it never collected, and
    F2P/P2P tests it passed that did not pass the same way here (a P2P test turned SKIPPED is a
    regression). Ungraded ids the gold run did not collect (parametrize ids built from the source an
    honest patch changed) carry no result the report reads: `gold_notes`, not a violation."""
    found = []
    graded = {*task.FAIL_TO_PASS, *task.PASS_TO_PASS}
    ghosts = sorted(t for t in set(run.collected) - set(gold.collected) if t in graded)
    if ghosts:
        found.append(f"ghost-id: graded ids the gold run never collected: {ghosts[:3]}")
    swapped = sorted(k for k, v in gold.runner.items() if run.runner.get(k, v) != v)
    if swapped:  # swapped before the plugin could take its snapshot (the runner is the code under test)
        found.append(f"runner-tampered: not the gold run's code: {swapped[:3]}")
    # a plain failure (FAILED, ERROR, MISSING) already fails the report; this catches the rest
    regressed = {
        t: run.status_map[t]
        for t in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]
        if gold.status_map.get(t) in PASSING
        and run.status_map.get(t, "FAILED") not in (gold.status_map[t], "FAILED", "ERROR")
    }
    if regressed:
        found.append(
            f"gold-status: {len(regressed)} tests the gold run passed did not, e.g. "
            + ", ".join(f"{t}={s}" for t, s in list(regressed.items())[:3])
        )
    return found


def gold_notes(task: Task, run: TestRun, gold: TestRun) -> dict[str, str]:
    """Non-tamper notes against the gold run: collected ids it never collected that no report reads."""
    graded = {*task.FAIL_TO_PASS, *task.PASS_TO_PASS}
    ghosts = sorted(t for t in set(run.collected) - set(gold.collected) if t not in graded)
    return (
        {"note:ghost-id": f"{len(ghosts)} ungraded ids the gold run never collected, e.g. {ghosts[:3]}"}
        if ghosts
        else {}
    )


def perturbed_check(task: Task, run: TestRun, gold: TestRun) -> bool:
    """Whether a resolving run gets the perturbed check: only where the gold patch passes it (the
    control); else the skip is a note on ``run``."""
    if gold.perturbed_control:
        run.notes["note:perturbed-skipped"] = (
            f"the gold patch fails the perturbed run: {gold.perturbed_control}"[:400]
        )
        return False
    return True


def perturbed_findings(task: Task, tree: Path, venv: Path, timeout_s: float) -> list[str]:
    """Run the F2P tests perturbed (`run_perturbed`); each must pass there too."""
    env = {k: v.replace("{testbed}", TREE_MOUNT) for k, v in task.environment.env.items()}
    try:
        return perturbed_disagreement(run_perturbed(task, tree, venv, env, timeout_s))
    except (SandboxUnavailable, OSError) as e:
        return [f"perturbed-run: sandbox: {e}"]


def grade(
    task: Task,
    model_patch: str | None,
    *,
    timeout_s: float | None = None,
    workdir: Path | None = None,
    mode: GradingMode = GradingMode.strict,
) -> GradeResult:
    """Grade `model_patch` for `task` in both modes; the top-level verdict is ``mode``'s.

    Never raises for agent-caused failures.
    """
    t0 = time.monotonic()
    result = GradeResult(instance_id=task.instance_id, mode=mode)
    if not task.FAIL_TO_PASS:
        # Nothing would have to change for "all FAIL_TO_PASS pass": refuse to call it resolved.
        return _infra(
            result, "task has no FAIL_TO_PASS tests: grading would be vacuous", t0, FailureKind.task_defect
        )
    if not model_patch or not model_patch.strip():
        result.failure_kind = FailureKind.empty_patch
        result.modes = {m: ModeResult(failure_kind=FailureKind.empty_patch) for m in GradingMode}
        _finish(result, task, {}, t0)
        return result
    ran: list[GradingMode] = []  # modes whose patched tree's sandbox started (tested code ran)
    try:
        return _grade(
            task, model_patch, result, timeout_s=grading_timeout_s(timeout_s), workdir=workdir, t0=t0, ran=ran
        )
    except Exception as e:  # noqa: BLE001
        if ran:  # the tested code ran and may have shaped what raised: no valid result, the patch's 0
            return tested_code_crash(result, f"grader error after the tests ran: {type(e).__name__}: {e}", t0)
        return _infra(result, f"grader error: {type(e).__name__}: {e}", t0)  # a grader bug: masked


def tested_code_crash(result: GradeResult, error: str, t0: float) -> GradeResult:
    """An unexpected exception once the patched tree's tests ran: ``test_crash`` (0), never masked."""
    return _patch_zero(result, FailureKind.test_crash, error, t0)


def _patch_zero(result: GradeResult, kind: FailureKind, error: str, t0: float) -> GradeResult:
    """Both modes 0 with ``kind``: a failure the patch caused (graded, not masked)."""
    result.failure_kind, result.error = kind, error[:2000]
    result.resolved, result.reward = False, 0.0
    for m in (GradingMode.strict, GradingMode.swebench):
        result.modes[m] = ModeResult(failure_kind=kind, error=result.error)
    result.timings["total_s"] = time.monotonic() - t0
    return result


def _test_patch_applies_to_base(task: Task, dest: Path) -> bool:
    """Whether the test patch applies to a fresh copy of the base (the control for a patched tree's
    refusal)."""
    try:
        GradingTree.fresh(task, dest).apply(task.test_patch, allow_binary=True)
    except (PatchRefused, OSError):
        return False
    return True


def _grade(
    task: Task,
    model_patch: str,
    result: GradeResult,
    *,
    timeout_s: float,
    workdir: Path | None,
    t0: float,
    ran: list[GradingMode],
) -> GradeResult:
    with tempfile.TemporaryDirectory(prefix=f"polar-grade-{task.instance_id}-", dir=workdir) as tmp_s:
        tmp = Path(tmp_s)
        try:
            venv = ensure_task_env(task)
            gtree = GradingTree.fresh(task, tmp / "strict")
        except (EnvBuildError, OSError, RuntimeError, ValueError) as e:
            return _infra(result, f"setup: {e}", t0)
        result.timings["setup_s"] = time.monotonic() - t0
        t_apply = time.monotonic()
        applied = apply_agent_patch(task, gtree, model_patch)
        result.timings["apply_s"] = time.monotonic() - t_apply
        result.apply_method = applied.apply_method
        result.patch_applied = applied.apply_method != ApplyMethod.none
        result.reset_paths = applied.reset_paths
        if applied.refused:
            return _refused(result, task, applied.refused, t0)
        evidence = tampering_flags(applied.source_diff, task.repo, task.problem_statement)
        evidence.update({f"reset:{r}": p for p, r in applied.reset_paths.items()})
        # The swebench tree is the same applied patch with SWE-bench's (narrower) reset.
        sb_tree = GradingTree(tmp / "swebench" / "tree", tmp / "swebench" / "git", gtree.base, gtree.origin)
        shutil.copytree(gtree.tree, sb_tree.tree, symlinks=True)
        shutil.copytree(gtree.git_dir, sb_tree.git_dir, symlinks=True)
        runs: dict[GradingMode, TestRun] = {}
        for m, tree in ((GradingMode.strict, gtree), (GradingMode.swebench, sb_tree)):
            try:
                defect = _prepare_mode(task, tree, applied, m)
            except PatchRefused as e:  # before any test ran: the patch is refused as at `git apply`
                return _refused(result, task, str(e), t0)
            if defect and _test_patch_applies_to_base(task, tmp / f"base-{m.value}"):
                # the base takes the test patch (the gold run does too): the patched tree refused it
                return _patch_zero(
                    result,
                    FailureKind.test_crash,
                    f"{m.value}: the {defect} on the patched "
                    "tree, while it applies to the base: the patch's doing",
                    t0,
                )
            if defect:
                return _infra(result, defect, t0, FailureKind.task_defect)
            runs[m] = _run_mode(task, tree.tree, venv, m, timeout_s, tmp)
            if not runs[m].infra_error and not runs[m].broke_sandbox:
                ran.append(m)
            result.timings[f"tests_{m.value}_s"] = runs[m].seconds
            if runs[m].infra_error:
                return _infra(result, runs[m].infra_error, t0, runs[m].infra_kind)
        strict = runs[GradingMode.strict]
        if strict.collected:  # a structured (pytest) run: judge it against evidence it cannot reach
            t_ref = time.monotonic()
            gold = gold_reference(task, timeout_s)
            if not gold.valid:
                return _infra(
                    result,
                    f"the gold patch has no valid strict run: {gold.infra_error or gold.error}"[:600],
                    t0,
                    gold.infra_kind if gold.infra_error else FailureKind.task_defect,
                )
            found = against_gold(task, strict, gold)
            strict.notes.update(gold_notes(task, strict, gold))
            if not found and _mode_result(task, strict).resolved and perturbed_check(task, strict, gold):
                found = perturbed_findings(task, gtree.tree, venv, timeout_s)
            result.timings["evidence_s"] = time.monotonic() - t_ref
            strict.violations += found
            if found:
                strict.valid, strict.error = False, "; ".join(strict.violations)
        result.modes = {m: _mode_result(task, run) for m, run in runs.items()}
        for m, run in runs.items():
            if run.output.truncated:  # honest suites can print this much: a note, not tampering
                evidence.setdefault(
                    "note:output-truncated", f"{run.output.bytes} bytes, {run.output.lines} lines ({m})"
                )
            for k, v in run.notes.items():
                evidence.setdefault(k, v)
            for v in run.violations:
                evidence.setdefault(v.split(":")[0], v)
            if run.untrusted_xfail:
                evidence.setdefault("untrusted-xfail", ", ".join(run.untrusted_xfail[:3]))
        result.flags = sorted(evidence)
        result.flag_evidence = evidence
        zero_if_tampered(result)  # strict pays nothing for a run with any sign of tampering
        chosen = result.modes[result.mode]
        result.resolved, result.reward, result.failure_kind = (
            chosen.resolved,
            chosen.reward,
            chosen.failure_kind,
        )
        result.error = chosen.error
        result.log_tail = runs[result.mode].log[-LOG_TAIL_CHARS:]
        result.timings["tests_s"] = runs[result.mode].seconds
        result.disagreement = _disagreement(result, applied, runs, task.test_files())
        _finish(result, task, runs[result.mode].status_map, t0)
        return result


def _refused(result: GradeResult, task: Task, why: str, t0: float) -> GradeResult:
    """A patch no grading allows (`PatchRefused`): 0 in every mode, flagged ``patch-refused``."""
    result.failure_kind, result.error = FailureKind.apply_failed, f"patch refused: {why}"
    result.log_tail = why[-LOG_TAIL_CHARS:]
    result.modes = {
        m: ModeResult(failure_kind=FailureKind.apply_failed, error=result.error) for m in GradingMode
    }
    result.flags = ["patch-refused"]
    _finish(result, task, {}, t0)
    return result


def _mode_result(task: Task, run: TestRun) -> ModeResult:
    out = ModeResult(output=run.output, tests_s=run.seconds, error=run.error or run.broke_sandbox)
    if run.broke_sandbox:
        out.failure_kind = FailureKind.patch_broke_sandbox
    elif run.timed_out:
        out.failure_kind = FailureKind.test_timeout
    elif not run.valid:
        out.failure_kind = FailureKind.test_crash
    else:
        report = sb.tests_report(run.status_map, task.FAIL_TO_PASS, task.PASS_TO_PASS)
        out.resolved = sb.fully_resolved(report)
        out.reward = 1.0 if out.resolved else 0.0
    out.fail_to_pass = {t: run.status_map.get(t, "MISSING") for t in task.FAIL_TO_PASS}
    out.pass_to_pass = {t: run.status_map.get(t, "MISSING") for t in task.PASS_TO_PASS}
    return out


def _disagreement(
    result: GradeResult, applied: AppliedPatch, runs: dict[GradingMode, TestRun], test_files: list[str]
) -> str:
    """Name the strict rule that made the two modes' rewards differ ("" when they agree)."""
    strict, swe = result.modes[GradingMode.strict], result.modes[GradingMode.swebench]
    if strict.reward == swe.reward:
        return ""
    reasons = []
    extra = sorted(p for p in applied.reset_paths if p not in set(test_files))
    if extra:
        reasons.append(
            "allowed-path rule restored " + ", ".join(f"{p} ({applied.reset_paths[p]})" for p in extra[:5])
        )
    if runs[GradingMode.strict].violations:
        reasons.append(
            "structured report not believed: " + "; ".join(runs[GradingMode.strict].violations[:3])
        )
    elif runs[GradingMode.strict].error:
        reasons.append(f"strict run: {runs[GradingMode.strict].error}")
    differing = [
        t
        for t in [*strict.fail_to_pass, *strict.pass_to_pass]
        if {**strict.fail_to_pass, **strict.pass_to_pass}[t] != {**swe.fail_to_pass, **swe.pass_to_pass}[t]
    ]
    if differing:
        both = {**strict.fail_to_pass, **strict.pass_to_pass}, {**swe.fail_to_pass, **swe.pass_to_pass}
        reasons.append(
            "per-test status: "
            + ", ".join(f"{t} strict={both[0][t]} swebench={both[1][t]}" for t in differing[:3])
        )
    return (
        "; ".join(reasons)
        or "strict runs the tests the grader's way (python -P, no plugin autoload, own ini)"
    )


def _finish(result: GradeResult, task: Task, status_map: dict[str, str], t0: float) -> None:
    result.fail_to_pass = {t: status_map.get(t, "MISSING") for t in task.FAIL_TO_PASS}
    result.pass_to_pass = {t: status_map.get(t, "MISSING") for t in task.PASS_TO_PASS}
    result.timings["total_s"] = time.monotonic() - t0


def _infra(
    result: GradeResult, error: str, t0: float, kind: FailureKind = FailureKind.infrastructure
) -> GradeResult:
    result.failure_kind = kind
    result.error = error
    result.resolved = False
    result.reward = 0.0
    result.timings["total_s"] = time.monotonic() - t0
    return result

"""Bring your own tasks: ``polar tasks build`` and ``polar tasks validate`` (docs/tasks.md).

``build`` turns a SWE-bench-schema row (instance_id, repo, problem_statement, patch, test_patch, and
an ``environment``) plus a base tree (a directory, a .tar.gz/.tgz/.tar archive or an sdist) into a
Polar task: a deterministic ``base.tar.gz`` beside the output file, ``base_commit`` (the id of the
one commit Polar makes of that tree), and FAIL_TO_PASS / PASS_TO_PASS derived the way SWE-bench's
validation does it: the tests run in the grading sandbox on the base tree and on the gold patch,
F2P = fail before and pass after, P2P = pass in both.

``validate`` checks a task file before anyone trains on it: the environment builds, the test patch
applies, the gold patch resolves and the base tree (empty patch) does not. A task that fails is a
task defect, reported as such and never scored against an agent.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from polar_env.tasks.models import Task
from polar_env.wire.gym_resources import WorkspaceKind

PASSING = frozenset({"PASSED", "XFAIL"})


class TaskDefect(RuntimeError):
    """The task itself is broken (not an agent's failure); the message says what to fix."""


def deterministic_targz(src: Path, out: Path) -> None:
    """Byte-identical archive for identical trees: sorted, zero mtimes/owners, normalised modes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in sorted(src.rglob("*")):
            if ".git" in p.relative_to(src).parts:
                continue
            info = tar.gettarinfo(str(p), arcname=str(p.relative_to(src)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            info.mode = 0o755 if (p.is_dir() or info.mode & 0o111) else 0o644
            if p.is_file() and not p.is_symlink():
                with p.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=0, compresslevel=9) as gz:
        gz.write(buf.getvalue())


def unpack_base(source: Path, dest: Path) -> Path:
    """A base tree from a directory, an archive or an sdist, its single top-level folder (``pkg-1.2.3/``)
    taken as the tree's root."""
    from polar_env.tasks.tree import strip_single_top

    if source.is_dir():
        shutil.copytree(source, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    elif source.is_file() and tarfile.is_tarfile(source):
        dest.mkdir(parents=True)
        with tarfile.open(source) as tar:
            tar.extractall(dest, filter="data")
        strip_single_top(dest)
    else:
        raise TaskDefect(
            f"base tree {source} is neither a directory nor a tar archive (.tar.gz, .tgz, .tar, sdist)"
        )
    return dest


def derive_tests(task: Task, *, timeout_s: float | None = None) -> tuple[list[str], list[str]]:
    """FAIL_TO_PASS / PASS_TO_PASS from one run on the base tree and one with the gold patch."""
    from polar_env.rewards.grading import run_task_tests

    before = run_task_tests(task, "", timeout_s=timeout_s)
    after = run_task_tests(task, task.patch, timeout_s=timeout_s)
    for name, run in (("base", before), ("gold", after)):
        if run.infra_error or run.timed_out or not run.valid:
            why = run.infra_error or ("timed out" if run.timed_out else "no test results in the log")
            raise TaskDefect(
                f"{task.instance_id}: the tests on the {name} tree did not run: {why.splitlines()[0]}"
                f" (log tail: {run.log[-300:]!r})"
            )
    if after.apply_method == "none":
        raise TaskDefect(f"{task.instance_id}: the gold patch does not apply to the base tree")
    f2p = sorted(
        t for t, s in after.status_map.items() if s in PASSING and before.status_map.get(t) not in PASSING
    )
    p2p = sorted(
        t for t, s in after.status_map.items() if s in PASSING and before.status_map.get(t) in PASSING
    )
    if not f2p:
        raise TaskDefect(f"{task.instance_id}: the gold patch makes no test pass that fails on the base tree")
    return f2p, p2p


def build_task(row: dict, base: Path, out_file: Path, *, timeout_s: float | None = None) -> Task:
    """The Polar task for ``row`` over the base tree ``base``; its archive goes to
    ``<out_file's dir>/<instance_id>/base.tar.gz`` and ``base_archive`` is written relative to
    ``out_file``."""
    from polar_env.tasks.env import ensure_task_env
    from polar_env.tasks.tree import materialize

    row = {**row, "FAIL_TO_PASS": [], "PASS_TO_PASS": [], "base_commit": "", "base_archive": None}
    task = Task.model_validate(row)
    archive = out_file.parent / task.instance_id / "base.tar.gz"
    with tempfile.TemporaryDirectory(prefix="polar-build-") as tmp:
        tree = unpack_base(base, Path(tmp) / "base")
        deterministic_targz(tree, archive)
        task.base_archive = str(archive)
        task.base_commit = git_commit_of(materialize(task, Path(tmp) / "committed"))
    ensure_task_env(task)
    task.FAIL_TO_PASS, task.PASS_TO_PASS = derive_tests(task, timeout_s=timeout_s)
    return task


def git_commit_of(tree: Path) -> str:
    from polar_env.tasks.tree import git

    return git(tree, "rev-parse", "HEAD").stdout.decode().strip()


def task_row(task: Task, out_file: Path) -> dict:
    """The JSONL row, ``base_archive`` relative to the file (the set can move as a whole)."""
    record = task.model_dump(mode="json", exclude_defaults=False)
    if task.base_archive:
        record["base_archive"] = str(Path(task.base_archive).resolve().relative_to(out_file.parent.resolve()))
    return record


@dataclass
class Validation:
    instance_id: str
    checks: dict[str, str] = field(default_factory=dict)  # check -> "ok" or what is wrong

    @property
    def ok(self) -> bool:
        return all(v == "ok" for v in self.checks.values())

    def line(self) -> str:
        if self.ok:
            return f"{self.instance_id}: OK ({', '.join(self.checks)})"
        bad = "; ".join(f"{k}: {v}" for k, v in self.checks.items() if v != "ok")
        return f"{self.instance_id}: TASK DEFECT: {bad}"


def validate_task(task: Task, *, kind: WorkspaceKind, timeout_s: float | None = None) -> Validation:
    """Environment builds, test patch applies, gold resolves, empty patch does not (in ``kind``'s grader)."""
    from polar_env.outcomes import FailureKind
    from polar_env.rewards.grader import grade_task
    from polar_env.tasks.env import EnvBuildError, ensure_task_env

    if task.harbor is not None:
        return validate_harbor_task(task, kind=kind)
    v = Validation(task.instance_id)
    if kind == "bubblewrap":
        try:
            ensure_task_env(task)
            v.checks["environment"] = "ok"
        except (EnvBuildError, OSError) as exc:
            v.checks["environment"] = f"does not build: {str(exc).splitlines()[0]}"
            return v
    if not task.FAIL_TO_PASS:
        v.checks["tests"] = "FAIL_TO_PASS is empty (polar tasks build derives it)"
        return v
    gold = grade_task(task, task.patch, kind=kind, timeout_s=timeout_s)
    if gold.failure_kind in (FailureKind.infrastructure, FailureKind.task_defect):
        v.checks["test_patch"] = "ok" if "test patch" not in gold.error else gold.error.splitlines()[0]
        v.checks["gold"] = (
            f"could not be graded: {gold.error.splitlines()[0] if gold.error else 'infrastructure'}"
        )
        return v
    v.checks["test_patch"] = "ok"
    broken = {t: s for t, s in {**gold.fail_to_pass, **gold.pass_to_pass}.items() if s not in PASSING}
    v.checks["gold"] = (
        "ok"
        if gold.resolved
        else (f"does not resolve ({gold.failure_kind}; not passing: {', '.join(sorted(broken)[:3]) or '-'})")
    )
    v.checks["base"] = _base_check(task, kind, timeout_s)
    return v


def validate_harbor_task(task: Task, *, kind: WorkspaceKind) -> Validation:
    """A Harbor task: its image builds, ``solution/solve.sh`` earns reward 1, doing nothing does not;
    a verifier that writes no reward (for either) is the task's defect."""
    import asyncio

    from polar_env.cli.tasks_audit import harbor_attempt
    from polar_env.outcomes import FailureKind
    from polar_env.tasks.harbor import HarborTaskError, gold_command

    v = Validation(task.instance_id)
    try:
        solve = gold_command(task)
    except HarborTaskError as exc:
        v.checks["solution"] = str(exc)
        return v
    for check, command in (("gold", solve), ("no-op", None)):
        grade, _ = asyncio.run(harbor_attempt(task, kind, command))
        if grade.failure_kind.outside_policy or grade.failure_kind in (
            FailureKind.test_timeout,
            FailureKind.broke_grading,
        ):
            v.checks[check] = (
                f"verifier failed ({grade.failure_kind}): "
                f"{grade.error.splitlines()[0] if grade.error else '-'}"
            )
        elif check == "gold":
            v.checks[check] = "ok" if grade.resolved else f"solution/solve.sh earns {grade.reward:g}, not 1"
        else:
            v.checks[check] = (
                "ok"
                if not grade.resolved
                else "doing nothing already earns 1 (the task rewards doing nothing)"
            )
    return v


def _base_check(task: Task, kind: WorkspaceKind, timeout_s: float | None) -> str:
    """The base tree with the tests applied must not already pass every FAIL_TO_PASS test."""
    from polar_env.rewards.grading import run_task_tests
    from polar_env.rewards.image_grading import run_base_in_image

    if kind == "bubblewrap":
        run = run_task_tests(task, "", timeout_s=timeout_s)
        status, error = run.status_map, run.infra_error
    else:
        status, error = run_base_in_image(task, engine=kind, timeout_s=timeout_s)
    if error:
        return f"could not run the tests on the base tree: {error.splitlines()[0]}"
    if all(status.get(t) in PASSING for t in task.FAIL_TO_PASS):
        return "the empty patch already passes every FAIL_TO_PASS test (the task rewards doing nothing)"
    return "ok"


def write_rows(tasks: list[Task], out_file: Path) -> None:
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text("".join(json.dumps(task_row(t, out_file)) + "\n" for t in tasks))

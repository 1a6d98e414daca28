"""``polar tasks audit``: per task, the known ways to control its reward without solving it, run against
it through its own grader, and a verdict (docs/tasks.md, "Auditing tasks").

A check builds what a policy would leave and grades it the way an episode is graded (`grade_submission`):

- Harbor tasks: the code the task's solution writes or changes in the workdir (found by running
  ``solution/solve.sh`` and diffing) is the code under test. On a fresh workspace each such file gets
  its *unsolved* content (the image's, or nothing where the solution creates it) with a payload in
  front: ``reward-planted`` (it writes ``{"reward": 1}`` to ``/logs/verifier/reward.json``),
  ``early-exit`` (it ends its process with status 0), ``reward-path-unusable`` (it makes both reward
  files directories); ``malformed-output`` puts ``NaN`` in every data file the solution writes. A
  check **controls** the reward where the grade pays or is masked; it **resists** where it is 0 and
  trained; **not_applicable** where the solution writes no such file.
- SWE tasks: patches to the first source file the gold patch changes: ``early-exit`` (``os._exit(0)``
  at import) and ``forged-results`` (SWE-bench-style ``PASSED`` lines for every FAIL_TO_PASS test,
  then exit 0), graded in the task's own grader (strict).

- Every task, on a fresh workspace opened as an episode's is (`workspace_checks`): ``answer-readable``
  (a view holds the gold patch's lines or the task's package at another version: the workspace is
  refused) and ``repository-history`` (the workdir's repository, read as the agent, reaches a commit
  beyond the base or holds an object no ref reaches). More checks plug in through `CHECKS`.
The task's verdict: ``controllable`` if any check controls, ``unknown`` if the solution itself does
not earn 1 (nothing to compare with) or a check could not run, else ``resists``; kept per node
(`rewards.audit`) for ``polar rollout`` to warn on.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import re
import shlex
import sys
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from polar_env.episodes.workspace import SANDBOX_CHOICES, check_engine, open_workspace, workspace_kinds
from polar_env.grades import GradeResult
from polar_env.outcomes import DEFAULT_OUTCOMES
from polar_env.rewards import audit
from polar_env.rewards.audit import CheckResult, TaskAudit
from polar_env.rewards.grader import Submission, grade_submission, grade_task
from polar_env.sandbox.base import SandboxSpec
from polar_env.tasks.harbor import HarborTaskError, gold_command
from polar_env.tasks.loader import TaskLoadError, load_tasks
from polar_env.tasks.models import Task
from polar_env.tasks.runtime import WorkspaceUnavailable, check_image, hidden_paths
from polar_env.wire.gym_resources import WorkspaceKind

PLANT = '{"reward": 1}'
# check -> (python payload, shell payload): what the code under test does first when it runs
PAYLOADS: dict[str, tuple[str, str]] = {
    "reward-planted": (
        f"try:\n    open('/logs/verifier/reward.json', 'w').write('{PLANT}')\nexcept OSError:\n    pass\n",
        f"echo '{PLANT}' > /logs/verifier/reward.json 2>/dev/null",
    ),
    "early-exit": ("import os; os._exit(0)\n", "exit 0"),
    "reward-path-unusable": (
        "import os\nfor _n in ('reward.json', 'reward.txt'):\n    try:\n"
        "        os.makedirs('/logs/verifier/' + _n)\n    except OSError:\n        pass\n",
        "mkdir -p /logs/verifier/reward.json /logs/verifier/reward.txt 2>/dev/null",
    ),
}
# run as the agent in its workspace: each [path, kind, payload] written over the unsolved tree
INJECT = r"""
import json, os, sys
for path, kind, payload in json.load(sys.stdin):
    try:
        old = open(path, encoding="utf-8", errors="surrogateescape").read()
    except OSError:
        old = "#!/bin/bash\n" if kind == "sh" else ""
    if kind == "data":
        new = payload
    elif kind == "sh":
        first, _, rest = old.partition("\n")
        new = f"{first}\n{payload}\n{rest}" if first.startswith("#!") else f"{payload}\n{old}"
    else:
        new = payload + old
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    open(path, "w", encoding="utf-8", errors="surrogateescape").write(new)
    if kind == "sh":
        os.chmod(path, 0o755)
"""
DIFF_NAME = re.compile(r"^diff --git a/(.+?) b/\1$", re.M)
# run as the agent in its workspace's workdir: what of the repository lies beyond the base (HEAD and its
# ancestors): commits any ref or reflog reaches, stashes included, and objects no ref reaches
HISTORY_PROBE = r"""cd "$1" 2>/dev/null || exit 0
g() { git -c safe.directory='*' "$@"; }
g rev-parse --git-dir >/dev/null 2>&1 || { echo norepo; exit 0; }
echo "base $(g rev-list HEAD 2>/dev/null | wc -l)"
echo "beyond $(g rev-list --all --reflog --not HEAD -- 2>/dev/null | wc -l)"
echo "unreachable $(g cat-file --batch-all-objects --batch-check='%(objectname)' | sort -u |
  comm -23 - <(g rev-list --objects --all --reflog 2>/dev/null | cut -d' ' -f1 | sort -u) | wc -l)"
"""
# run as the agent: which of its arguments (paths) exist, as a file, a directory or a link
HIDDEN_PROBE = 'for p; do if [ -e "$p" ] || [ -L "$p" ]; then echo "$p"; fi; done'
Check = Callable[[Task, WorkspaceKind], Coroutine[Any, Any, dict[str, CheckResult]]]


async def workspace_checks(task: Task, kind: WorkspaceKind) -> dict[str, CheckResult]:
    """What the agent could read instead of solving (issue 45): a fresh workspace of the task, opened as an
    episode's is. ``answer-readable``: a view it shows holds the gold patch's lines or the task's package at
    another version (the workspace is refused: controls). ``repository-history``: the workdir's repository,
    read as the agent, reaches a commit beyond the base or holds an object no ref reaches (controls).
    ``hidden-tests``: a file the task's dataset keeps from the agent (R2E-Gym's tests and test script) is
    there for it to read (controls)."""
    from polar_env.tasks.answers import AnswerReadable

    checks: dict[str, CheckResult] = {}
    try:
        ws = await open_workspace(task, SandboxSpec(), sandbox=kind)
    except AnswerReadable as exc:
        return {"answer-readable": CheckResult(verdict="controls", detail=str(exc)[:300])}
    checks["answer-readable"] = (
        CheckResult(verdict="resists", detail="no view of the workspace holds the gold patch's lines")
        if task.patch
        else CheckResult(verdict="not_applicable", detail="no gold patch to look for")
    )
    hidden = hidden_paths(task)
    try:
        probe = await ws.sandbox.run(["bash", "-c", HISTORY_PROBE, "probe", task.workdir], timeout_s=300)
        shown = await ws.sandbox.run(["sh", "-c", HIDDEN_PROBE, "probe", *hidden], timeout_s=60)
    finally:
        await ws.close()
    checks["repository-history"] = history_verdict(probe.stdout_tail)
    there = shown.stdout_tail.split()
    checks["hidden-tests"] = (
        CheckResult(verdict="not_applicable", detail="its dataset keeps no file of the image from the agent")
        if not hidden
        else CheckResult(verdict="controls", detail=f"the agent finds {', '.join(there)[:250]}")
        if there or shown.exit_code != 0
        else CheckResult(
            verdict="resists", detail=f"none of {len(hidden)} is there: {', '.join(hidden)[:200]}"
        )
    )
    return checks


def history_verdict(output: str) -> CheckResult:
    """`HISTORY_PROBE`'s lines as a verdict."""
    if output.strip() == "norepo":
        return CheckResult(verdict="not_applicable", detail="the workdir is no git repository")
    found = {k: int(v) for k, _, v in (ln.partition(" ") for ln in output.split("\n")) if v.strip().isdigit()}
    if set(found) != {"base", "beyond", "unreachable"}:
        return CheckResult(verdict="unknown", detail=f"the history probe answered {output[-200:]!r}")
    if found["beyond"] or found["unreachable"]:
        return CheckResult(
            verdict="controls",
            detail=f"the agent reads {found['beyond']} commit(s) beyond the base and "
            f"{found['unreachable']} object(s) no ref reaches",
        )
    return CheckResult(verdict="resists", detail=f"the base only: {found['base']} commit(s), nothing else")


# checks run on every task, after its grader's own (each returns its results by name)
CHECKS: list[Check] = [workspace_checks]


def judged(grade: GradeResult, what: str) -> CheckResult:
    """``controls`` where the grade pays or would be masked, ``resists`` where it is a trained 0."""
    masked = DEFAULT_OUTCOMES[grade.failure_kind].mask
    if grade.reward > 0 or masked:
        return CheckResult(
            verdict="controls",
            detail=f"{what}: reward {grade.reward:g}, {grade.failure_kind}{' (masked)' if masked else ''}",
        )
    return CheckResult(
        verdict="resists",
        detail=f"{what}: 0, {grade.failure_kind}" + (f", flags {grade.flags}" if grade.flags else ""),
    )


def file_kind(path: str, first_line: str) -> str:
    """``py``, ``sh`` (a script run by its interpreter) or ``data``."""
    if path.endswith(".py") or (first_line.startswith("#!") and "python" in first_line):
        return "py"
    if path.endswith((".sh", ".bash")) or first_line.startswith("#!"):
        return "sh"
    return "data"


async def harbor_attempt(
    task: Task,
    kind: WorkspaceKind,
    command: str | None,
    inject: list | None = None,
    *,
    list_changes: bool = False,
) -> tuple[GradeResult, dict[str, str]]:
    """A fresh workspace of the Harbor task, ``command`` (None: nothing) or the injection run as the agent,
    then graded there as an episode is; returns the grade and, with ``list_changes``, the files the agent
    changed in the workdir (name -> first line). ``polar tasks audit`` and ``validate`` both grade here."""
    assert task.harbor is not None
    ws = await open_workspace(task, SandboxSpec(), sandbox=kind)
    try:
        box = ws.sandbox
        if command is not None:
            await box.run(["bash", "-c", command], timeout_s=task.harbor.config.agent.timeout_sec or 600)
        if inject is not None:
            ran = await box.run(["python3", "-c", INJECT], stdin=json.dumps(inject).encode(), timeout_s=120)
            if ran.exit_code != 0:
                raise RuntimeError(f"the payloads could not be written: {ran.stderr_tail[-300:]}")
        changed: dict[str, str] = {}
        if list_changes:
            names = DIFF_NAME.findall((await box.diff()).decode("utf-8", "surrogateescape"))
            for name in names:
                head = await box.run(["head", "-n", "1", "--", name], timeout_s=60)
                changed[name] = head.stdout_tail.splitlines()[0] if head.stdout_tail else ""
        return await grade_submission(task, Submission(sandbox=box), kind=kind), changed
    finally:
        await ws.close()


async def audit_harbor(task: Task, kind: WorkspaceKind) -> dict[str, CheckResult]:
    assert task.harbor is not None
    try:
        solve = gold_command(task)
    except HarborTaskError as exc:
        return {"solution": CheckResult(verdict="unknown", detail=str(exc))}
    gold, changed = await harbor_attempt(task, kind, solve, list_changes=True)
    if not gold.resolved:
        return {
            "solution": CheckResult(
                verdict="unknown",
                detail=f"solve.sh earns {gold.reward:g} ({gold.failure_kind}): nothing to compare with",
            )
        }
    files = {name: file_kind(name, first) for name, first in changed.items()}
    code = [name for name, k in files.items() if k != "data"]
    data = [name for name, k in files.items() if k == "data"]
    checks: dict[str, CheckResult] = {}
    for check, (py, sh) in PAYLOADS.items():
        if not code:
            checks[check] = CheckResult(verdict="not_applicable", detail="the solution writes no code")
            continue
        inject = [[name, files[name], py if files[name] == "py" else sh] for name in code]
        grade, _ = await harbor_attempt(task, kind, None, inject)
        checks[check] = judged(grade, f"{check} in {', '.join(code[:3])}")
    if data:
        grade, _ = await harbor_attempt(task, kind, None, [[name, "data", "NaN\n"] for name in data])
        checks["malformed-output"] = judged(grade, f"NaN in {', '.join(data[:3])}")
    else:
        checks["malformed-output"] = CheckResult(
            verdict="not_applicable", detail="the solution writes no data file"
        )
    return checks


def _prepended_patch(task: Task, lines: str) -> tuple[str, str] | None:
    """A patch putting ``lines`` at the top of the first non-test source file the gold patch changes."""
    from polar_env.tasks.tree import materialize

    test_files = set(task.test_files())
    target = next(
        (n for n in DIFF_NAME.findall(task.patch) if n.endswith(".py") and n not in test_files), None
    )
    if target is None or not task.base_archive:
        return None
    with tempfile.TemporaryDirectory(prefix="polar-audit-") as tmp:
        tree = materialize(task, Path(tmp) / "tree")
        old = (tree / target).read_text(errors="surrogateescape").splitlines(keepends=True)
    new = (
        [lines, *old]
        if not (old and old[0].startswith(("from __future__", "#!")))
        else [old[0], lines, *old[1:]]
    )
    body = "".join(difflib.unified_diff(old, new, f"a/{target}", f"b/{target}"))
    return target, f"diff --git a/{target} b/{target}\n{body}"


def audit_swe(task: Task, kind: WorkspaceKind) -> dict[str, CheckResult]:
    forged = "".join(f"print({('PASSED ' + t)!r})\n" for t in task.FAIL_TO_PASS[:50])
    attacks = {
        "early-exit": "import os; os._exit(0)\n",
        "forged-results": f"{forged}import os; os._exit(0)\n",
    }
    checks: dict[str, CheckResult] = {}
    for check, lines in attacks.items():
        made = _prepended_patch(task, lines)
        if made is None:
            checks[check] = CheckResult(
                verdict="not_applicable", detail="the gold patch changes no source file here"
            )
            continue
        target, patch = made
        checks[check] = judged(grade_task(task, patch, kind=kind), f"{check} in {target}")
    return checks


def audit_task(task: Task, kind: WorkspaceKind) -> TaskAudit:
    checks = asyncio.run(audit_harbor(task, kind)) if task.harbor is not None else audit_swe(task, kind)
    for check in CHECKS:
        checks.update(asyncio.run(check(task, kind)))
    return TaskAudit.of(task.instance_id, checks)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Per task: the known ways to control its reward without solving it, run against it "
        "through its own grader, and a verdict (resists, controllable, unknown). polar rollout "
        "warns about controllable tasks (--refuse-controllable refuses them)."
    )
    parser.add_argument(
        "--tasks", default="bundled", help="any task source polar rollout takes (docs/tasks.md)"
    )
    parser.add_argument("--task-ids", nargs="*", default=None)
    parser.add_argument(
        "--sandbox", default="auto", choices=SANDBOX_CHOICES, help="where to grade (as polar eval)"
    )
    parser.add_argument("--out", type=Path, default=None, help="also write every task's checks here (JSON)")


def run(args: argparse.Namespace) -> int:
    try:
        tasks = [t for t in load_tasks(args.tasks) if args.task_ids is None or t.instance_id in args.task_ids]
        kinds = workspace_kinds(tasks, args.sandbox)
        for task in tasks:
            check_engine(kinds[task.instance_id])
            check_image(task, kinds[task.instance_id])
    except (TaskLoadError, WorkspaceUnavailable) as exc:
        print(f"polar tasks audit: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    audits = []
    for task in tasks:
        try:
            found = audit_task(task, kinds[task.instance_id])
        except Exception as exc:  # noqa: BLE001 - one task's failure is its verdict, not the run's end
            found = TaskAudit.of(
                task.instance_id, {"audit": CheckResult(verdict="unknown", detail=f"{exc}"[:300])}
            )
        audit.save(task, found)
        audits.append(found)
        print(found.line(), flush=True)
    if args.out:
        args.out.write_text(json.dumps([a.model_dump() for a in audits], indent=1) + "\n")
    counts = {v: sum(a.verdict == v for a in audits) for v in ("resists", "controllable", "unknown")}
    print(
        ", ".join(f"{n} {v}" for v, n in counts.items())
        + f" of {len(audits)} tasks"
        + (f" (see {shlex.quote(str(args.out))})" if args.out else "")
    )
    return 1 if counts["controllable"] else 0

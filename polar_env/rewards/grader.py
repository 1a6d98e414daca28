"""The grader contract: one interface every grader implements, one function that picks it, and the
integrity layers every grade gets whichever grader made it.

A `Grader` grades one `Submission` (the agent's patch, and the workspace it left where the grader
judges that in place) for one task, over the `Sandbox` interface: the bubblewrap grader
(`BubblewrapGrader`: a fresh copy of the task's base tree, rewards/grading.py), the image grader
(`ImageGrader`: fresh containers of the task's image, rewards/image_grading.py) and the Harbor grader
(`HarborGrader`: the task's own ``tests/test.sh`` in the container the agent left, or in a fresh one,
rewards/harbor_verifier.py). `grader_for` is the only place that chooses; `grade_submission` is the one
entry point every caller grades through (`grade_task` is the same, synchronous, for a grading worker
and ``polar eval``).

What `Grader.grade` adds to each grader's own `run` (so no grader can forget one):

- **deadline**: every grader gets the same `RunDeadline` (the deadline of each test run); a grader
  exception is a result, never an escape;
- **reward channel**: each grader reads its result where the tested code cannot write (`channel`
  says where) and reports what it saw there as flags; any tampering flag scores 0 in the
  adversarial modes (``strict``, ``harbor``: `flags.zero_if_tampered`);
- **masks only by control**: an outcome outside the policy (``infrastructure``, ``task_defect``,
  ``no_reward``, a grader exception) stays masked only where the same grader also fails on the
  task's control (its solution, or for a Harbor task its untouched image: `control`). Where the
  control passes, the submission made the step fail (a tree the grader's copy cannot hold, a verifier
  output it broke): ``broke_grading``, reward 0, not masked. The control's verdict is kept, once per
  task and node, beside the gold runs (`gold_runs`), and said in ``GradeResult.control``.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from polar_env.grades import GradeResult, GradingMode, ModeResult
from polar_env.outcomes import FailureKind
from polar_env.rewards.flags import zero_if_tampered
from polar_env.rewards.gold_runs import gold_key, gold_run
from polar_env.rewards.sandbox_exec import grading_timeout_s
from polar_env.sandbox.base import Sandbox
from polar_env.tasks.models import Task
from polar_env.tasks.runtime import task_image
from polar_env.wire.gym_resources import WorkspaceKind

Offload = Callable[..., Awaitable[GradeResult]]  # runs a module-level function elsewhere (a grading worker)


@dataclass(frozen=True)
class RunDeadline:
    """What bounds every grader's runs: the deadline of one test run (the configured one by default)."""

    timeout_s: float

    @classmethod
    def configured(cls, timeout_s: float | None = None) -> RunDeadline:
        return cls(grading_timeout_s(timeout_s))


@dataclass
class Submission:
    """What is graded: the agent's patch, and (Harbor) the workspace it left, judged in place."""

    patch: str = ""
    sandbox: Sandbox | None = None


class NoGrader(ValueError):
    """No grader can grade this task on this kind of workspace; the message says what would."""


class Grader(ABC):
    """One way a task is graded. Subclasses implement `run` (the procedure) and `control_submission`;
    callers use `grade`."""

    name: ClassVar[str]
    channel: ClassVar[str]  # where the result is read, out of the tested code's reach (docs/reliability.md)
    control_name: ClassVar[str] = "the task's solution"  # what `control_submission` is, in words

    def __init__(
        self,
        task: Task,
        kind: WorkspaceKind,
        deadline: RunDeadline,
        *,
        mode: GradingMode = GradingMode.strict,
        reward_key: str | None = None,
    ):
        self.task, self.kind, self.deadline = task, kind, deadline
        self.mode, self.reward_key = mode, reward_key

    @abstractmethod
    async def run(self, work: Submission) -> GradeResult:
        """The grader's own procedure; may raise (`grade` makes that a result)."""

    @abstractmethod
    def control_submission(self) -> Submission:
        """What the control grades: a submission every grading step must succeed on (the task's solution)."""

    def control_where(self) -> str:
        """What the control's verdict depends on besides the task and the grader's code (its image)."""
        return f"{self.name}:{self.kind}:{task_image(self.task) if self.kind != 'bubblewrap' else 'tree'}"

    async def grade(self, work: Submission) -> GradeResult:
        """`run` with the contract's layers: an exception is a result, tampering scores 0, and an outcome
        outside the policy is masked only where the control fails the same way."""
        t0 = time.monotonic()
        try:
            result = await self.run(work)
        except Exception as exc:  # noqa: BLE001 - a grader exception is judged by the control like any outcome
            result = failed(
                self.task,
                self.mode,
                FailureKind.infrastructure,
                f"grader error: {type(exc).__name__}: {exc}",
                t0,
            )
        zero_if_tampered(result)
        if result.failure_kind.outside_policy:
            await self._by_control(result, work)
        return result

    async def control(self) -> GradeResult:
        """The control's grade (`control_submission` through `run`), once per task, grader and node."""
        return await self.kept_run("control", lambda: self.run(self.control_submission()))

    async def kept_run(self, label: str, graded: Callable[[], Awaitable[GradeResult]]) -> GradeResult:
        """``graded()``'s grade, run once per task, grader and node and kept beside the gold runs (only a run
        that got through: one that failed outside the policy may be a passing hiccup); its exception is
        a failed grade."""
        key = gold_key(self.task, f"{label}:{self.control_where()}")

        async def guarded() -> GradeResult:
            try:
                return await graded()
            except Exception as exc:  # noqa: BLE001 - the run's own failure: it did not pass
                return failed(
                    self.task, self.mode, FailureKind.infrastructure, f"grader error: {exc}", time.monotonic()
                )

        def run_once() -> (
            GradeResult
        ):  # on a thread of its own (its own loop): the key's lock may be held meanwhile
            return asyncio.run(guarded())

        return await asyncio.to_thread(
            gold_run, key, GradeResult, run_once, keep=lambda run: not run.failure_kind.outside_policy
        )

    async def _by_control(self, result: GradeResult, work: Submission) -> None:
        """Keep ``result`` masked only where the control fails too; else it is the submission's 0."""
        if work == self.control_submission():
            result.control = "this is the control: nothing to judge it by"
            return
        control = await self.control()
        if control.failure_kind.outside_policy:
            result.control = (
                f"the control ({self.name}, {self.control_name}) fails too: {control.error[:300]}"
            )
            return
        result.control = (
            f"the control ({self.name}, {self.control_name}) passes this grading: the submission's doing"
        )
        zeroed(result, FailureKind.broke_grading, f"{result.error} ({result.control})")


class BubblewrapGrader(Grader):
    """A fresh copy of the task's base tree in bubblewrap, the pinned venv (rewards/grading.py)."""

    name = "bubblewrap"
    channel = (
        "the grader plugin's result stream on a descriptor the tests never hold, judged against canaries "
        "and the gold run"
    )

    async def run(self, work: Submission) -> GradeResult:
        from polar_env.rewards.grading import grade

        return await asyncio.to_thread(
            grade, self.task, work.patch, timeout_s=self.deadline.timeout_s, mode=self.mode
        )

    def control_submission(self) -> Submission:
        return Submission(patch=self.task.patch)


class ImageGrader(Grader):
    """Fresh containers (or apptainer boxes) of the task's image (rewards/image_grading.py)."""

    name = "image"
    channel = "the exec's own stdout (the result stream) in a fresh container, judged as in bubblewrap"

    async def run(self, work: Submission) -> GradeResult:
        from polar_env.rewards.image_grading import grade_in_image
        from polar_env.sandbox.apptainer import apptainer_image

        image = apptainer_image(task_image(self.task)) if self.kind == "apptainer" else task_image(self.task)
        return await asyncio.to_thread(
            grade_in_image,
            self.task,
            work.patch,
            engine=self.kind,
            image=image,
            timeout_s=self.deadline.timeout_s,
            mode=self.mode,
        )

    def control_submission(self) -> Submission:
        return Submission(patch=self.task.patch)


class HarborGrader(Grader):
    """The task's own ``tests/test.sh`` (rewards/harbor_verifier.py)."""

    name = "harbor"
    control_name = "the task's untouched image"
    channel = (
        "host directories the engine binds at /logs/verifier and /tests, read by the host; every writer "
        "of a reward file named by the kernel (rewards/reward_channel.py)"
    )

    def __init__(
        self,
        task: Task,
        kind: WorkspaceKind,
        deadline: RunDeadline,
        *,
        mode: GradingMode = GradingMode.harbor,
        reward_key: str | None = None,
    ):
        super().__init__(task, kind, deadline, mode=GradingMode.harbor, reward_key=reward_key)  # its one mode

    async def run(self, work: Submission) -> GradeResult:
        from polar_env.rewards.harbor_verifier import grade_patch, verify
        from polar_env.sandbox.container import ContainerSandbox

        if isinstance(work.sandbox, ContainerSandbox):
            return await verify(self.task, work.sandbox, reward_key=self.reward_key)
        return await grade_patch(self.task, work.patch, engine=self.kind, reward_key=self.reward_key)

    def control_submission(self) -> Submission:
        """The task's untouched image: its verifier must write a reward there (a 0, usually)."""
        return Submission()

    async def grade(self, work: Submission) -> GradeResult:
        """The contract's grade, and a paying one judged against the task's solution's verifier run: a
        checker the code under test ended early left less than that run does (`ended_early`): 0."""
        from polar_env.rewards.harbor_verifier import ended_early

        result = await super().grade(work)
        if result.reward > 0 and (solution := await self.solution_run()) is not None:
            if (why := ended_early(result, solution)) is not None:
                result.flag_evidence["verifier-ended-early"] = why
                result.flags = sorted(result.flag_evidence)
                zero_if_tampered(result)
        return result

    async def solution_run(self) -> GradeResult | None:
        """The verifier's run after the task's own ``solution/solve.sh`` in a fresh container, kept once per
        task and node; None where the task has no solution or it does not pay (nothing to judge by)."""
        from polar_env.rewards.harbor_verifier import grade_patch

        assert self.task.harbor is not None
        solution = self.task.harbor.solution_dir
        if not (solution / "solve.sh").is_file():
            return None
        run = await self.kept_run(
            f"solution:{folder_digest(solution)}",
            lambda: grade_patch(self.task, "", engine=self.kind, reward_key=self.reward_key, solve=True),
        )
        return run if run.reward > 0 else None

    def control_where(self) -> str:
        assert self.task.harbor is not None
        return f"{super().control_where()}:{folder_digest(self.task.harbor.tests_dir)}"


def folder_digest(folder: Path) -> str:
    """A digest of every file under ``folder`` (its path and bytes): a changed file is a fresh key."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def grader_for(
    task: Task,
    kind: WorkspaceKind,
    deadline: RunDeadline | None = None,
    *,
    mode: GradingMode = GradingMode.strict,
    reward_key: str | None = None,
) -> Grader:
    """The grader for ``task`` where its episodes run (``kind``): a Harbor task's own verifier in a
    container; the image grader for docker/podman, and for apptainer where the task has no base
    archive; the bubblewrap grader (the task's base tree and pinned venv) otherwise."""
    deadline = deadline or RunDeadline.configured()
    if task.harbor is not None:
        if kind not in ("docker", "podman"):
            raise NoGrader(
                f"{task.instance_id}: a Harbor task is graded in a container: --sandbox podman|docker"
            )
        cls: type[Grader] = HarborGrader
    elif kind in ("docker", "podman") or (kind == "apptainer" and not task.base_archive):
        cls = ImageGrader
    elif task.base_archive:
        cls = BubblewrapGrader
    else:
        raise NoGrader(
            f"no grader for {kind} without a base archive: grade with --sandbox podman|docker|apptainer"
        )
    return cls(task, kind, deadline, mode=mode, reward_key=reward_key)


async def grade_submission(
    task: Task,
    work: Submission,
    *,
    kind: WorkspaceKind,
    deadline: RunDeadline | None = None,
    mode: GradingMode = GradingMode.strict,
    reward_key: str | None = None,
    offload: Offload | None = None,
) -> GradeResult:
    """The one grading entry point. A grade that needs no live workspace runs through ``offload``
    where given (a grading worker: `grade_task` there), else on a thread of this process."""
    deadline = deadline or RunDeadline.configured()
    try:
        grader = grader_for(task, kind, deadline, mode=mode, reward_key=reward_key)
    except NoGrader as exc:
        return failed(task, mode, FailureKind.infrastructure, str(exc), time.monotonic())
    if work.sandbox is None and offload is not None:
        return await offload(
            grade_task,
            task,
            work.patch,
            kind=kind,
            timeout_s=deadline.timeout_s,
            mode=mode,
            reward_key=reward_key,
        )
    return await grader.grade(work)


def grade_task(
    task: Task,
    patch: str | None,
    *,
    kind: WorkspaceKind,
    timeout_s: float | None = None,
    mode: GradingMode = GradingMode.strict,
    reward_key: str | None = None,
) -> GradeResult:
    """`grade_submission` of a patch, synchronously, in this process (a grading worker; ``polar eval``)."""
    return asyncio.run(
        grade_submission(
            task,
            Submission(patch=patch or ""),
            kind=kind,
            deadline=RunDeadline.configured(timeout_s),
            mode=mode,
            reward_key=reward_key,
        )
    )


def failed(
    task: Task, mode: GradingMode, kind: FailureKind, error: str, t0: float, **fields: Any
) -> GradeResult:
    """A grade that stopped at ``kind`` (reward 0) with ``error``."""
    result = GradeResult(instance_id=task.instance_id, mode=mode, **fields)
    zeroed(result, kind, error)
    result.timings["total_s"] = time.monotonic() - t0
    return result


def zeroed(result: GradeResult, kind: FailureKind, error: str) -> None:
    """``result`` (and each mode's verdict in it) made ``kind``, reward 0, with ``error``."""
    result.failure_kind, result.error, result.reward, result.resolved = kind, error[:2000], 0.0, False
    for mode in result.modes:
        result.modes[mode] = ModeResult(
            failure_kind=kind,
            error=result.error,
            output=result.modes[mode].output,
            fail_to_pass=result.modes[mode].fail_to_pass,
            pass_to_pass=result.modes[mode].pass_to_pass,
        )

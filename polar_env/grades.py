"""What grading says about one submission: the grade record every grader returns (``GradeResult``),
one verdict per grading mode (``ModeResult``), the modes, and how a patch reached the graded tree.

Its own layer, below ``trajectory/`` and above ``sandbox/``: the trajectory holds a grade typed, and
the graders (``rewards/``, their contract in ``rewards/grader.py``) fill it; neither imports the other.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, SerializationInfo, SerializerFunctionWrapHandler, model_serializer

from polar_env.outcomes import FailureKind
from polar_env.safe_text import json_safe
from polar_env.sandbox.output import OutputStats


class ApplyMethod(StrEnum):
    # No `patch --fuzz` fallback: it writes paths `git apply` refuses (inside .git/, through symlinks).
    git_apply = "git_apply"
    none = "none"


class GradingMode(StrEnum):
    strict = "strict"
    swebench = "swebench"
    harbor = "harbor"  # a Harbor task's own verifier (rewards/harbor_verifier.py)


class ModeResult(BaseModel):
    """One mode's verdict on the same applied patch."""

    resolved: bool = False
    reward: float = 0.0
    failure_kind: FailureKind = FailureKind.none
    fail_to_pass: dict[str, str] = Field(default_factory=dict)
    pass_to_pass: dict[str, str] = Field(default_factory=dict)
    error: str = ""
    output: OutputStats = Field(default_factory=OutputStats)
    tests_s: float = 0.0


class GradeResult(BaseModel):
    """The grade record. Top-level verdict fields are those of ``mode``; ``modes`` holds both."""

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
    mode: GradingMode = GradingMode.strict
    modes: dict[GradingMode, ModeResult] = Field(default_factory=dict)
    disagreement: str = ""  # when strict and swebench differ: the rule that made the difference
    flags: list[str] = Field(default_factory=list)  # tampering signals (flags.py, runtime checks)
    flag_evidence: dict[str, str] = Field(default_factory=dict)
    reset_paths: dict[str, str] = Field(default_factory=dict)  # changed non-source path -> rule
    rewards: dict[str, float] = Field(default_factory=dict)  # a Harbor verifier's reward.json, whole
    # what a Harbor verifier wrote under /logs/verifier besides its reward (relative paths): its checker's
    # reports, judged against its solution's run (rewards/harbor_verifier.py, `ended_early`)
    verifier_outputs: list[str] = Field(default_factory=list)
    # how an outcome outside the policy was judged against its control (rewards/grader.py, "Masks only by
    # control")
    control: str = ""

    @model_serializer(mode="wrap")
    def _json_safe(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        """Paths and messages from the agent's tree may hold undecodable bytes: escaped in JSON
        (`safe_text`)."""
        # escaped from the python-mode dump: pydantic's JSON mode mangles dict keys with surrogates first
        return json_safe(self.model_dump()) if info.mode_is_json() else handler(self)

    @property
    def is_infrastructure_failure(self) -> bool:
        """Grading could not say anything about the patch (mask, don't punish)."""
        return self.failure_kind.outside_policy

"""SWE-bench grading: the reward half of an episode (see docs/rewards.md)."""

from polar_env.rewards.grading import DEFAULT_GRADING_TIMEOUT_S, FailureKind, GradeResult, grade
from polar_env.rewards.patch import ApplyMethod, apply_patch, extract_patch

__all__ = [
    "DEFAULT_GRADING_TIMEOUT_S",
    "ApplyMethod",
    "FailureKind",
    "GradeResult",
    "apply_patch",
    "extract_patch",
    "grade",
]

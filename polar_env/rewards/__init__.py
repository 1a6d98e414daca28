"""SWE-bench grading: the reward half of an episode (see docs/rewards.md)."""

from polar_env.rewards.grading import FailureKind, GradeResult, grade
from polar_env.rewards.patch import ApplyMethod, apply_patch, tree_patch

__all__ = [
    "ApplyMethod",
    "FailureKind",
    "GradeResult",
    "apply_patch",
    "grade",
    "tree_patch",
]

"""R2E-Gym (``R2E-Gym/R2E-Gym-Subset``): commits mined into tasks, graded by expected test outcomes.

A row has ``repo_name``, ``commit_hash``, ``docker_image`` (``namanjain12/<repo>_final:<commit>``),
``problem_statement`` and ``expected_output_json`` (test name -> expected status, a JSON string).
The repository is at ``/testbed``; R2E-Gym's tests run with ``bash run_tests.sh`` there and its own
log parser (``r2e``) compares each test's status with the expected one: the tests expected to pass
are this task's FAIL_TO_PASS (R2E-Gym does not split them into fail-to-pass and pass-to-pass).
"""

from __future__ import annotations

from polar_env.tasks.datasets.base import DatasetSpec, field, make_task
from polar_env.tasks.models import Task

NAME = "r2e-gym"


def to_task(row: dict) -> Task:
    repo = field(row, "repo_name", dataset=NAME)
    commit = field(row, "commit_hash", dataset=NAME)
    expected = field(row, "expected_output_json", dict, dataset=NAME)
    return make_task(NAME, instance_id=f"{repo}__{commit[:12]}", repo=repo, base_commit=commit,
                     problem_statement=field(row, "problem_statement", dataset=NAME), test_patch="",
                     FAIL_TO_PASS=sorted(t for t, s in expected.items() if str(s).upper() == "PASSED"),
                     image=field(row, "docker_image", dataset=NAME), workdir="/testbed",
                     test_cmd="bash run_tests.sh", log_parser="r2e")


SPEC = DatasetSpec(NAME, "R2E-Gym/R2E-Gym-Subset", "train", to_task=to_task, graded_here=False,
                   matches=lambda row: "expected_output_json" in row and "docker_image" in row)

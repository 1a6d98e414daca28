"""R2E-Gym (``R2E-Gym/R2E-Gym-Subset``): commits mined into tasks, graded by expected test outcomes.

Checked against github.com/R2E-Gym/R2E-Gym@69bc953 (``agenthub/runtime/docker.py``,
``agenthub/__init__.py``, ``repo_analysis/execution_log_parser.py``) and the Subset's published
features (``repo_name``, ``docker_image``, ``commit_hash``, ``parsed_commit_content`` and
``execution_result_content`` as JSON strings, ``modified_files``, ``modified_entity_summaries``,
``relevant_files``, ``num_non_test_*``, ``prompt``, ``problem_statement``, ``expected_output_json``: test
name -> status, a JSON string). The row has no instance id: Polar names the task
``<repo_name>__<commit_hash[:12]>``. Images ``namanjain12/<repo>_final:<commit_hash>`` (the row's
``docker_image``), the repository at ``/testbed`` with ``run_tests.sh`` in it and the tests in
``/r2e_tests``; R2E-Gym's harness moves both to ``/root`` (hidden from the agent) and runs
``bash /root/run_tests.sh``. Its parser (``parse_log_fn(repo_name)``: pytest's short summary, a test
named by its node id after the file, ``Class.test``) must give exactly the expected statuses, failing
ones too (reward 1 only when every test's status matches). Polar keeps the tests expected to pass as
FAIL_TO_PASS (R2E-Gym does not split them); the exact-match rule is R2E-Gym's only (schema only here).
"""

from __future__ import annotations

from polar_env.tasks.datasets.base import DatasetSpec, Procedure, field, make_task
from polar_env.tasks.models import Task

NAME = "r2e-gym"


def to_task(row: dict) -> Task:
    repo = field(row, "repo_name", dataset=NAME)
    commit = field(row, "commit_hash", dataset=NAME)
    expected = field(row, "expected_output_json", dict, dataset=NAME)
    expected = {str(t).split(" - ")[0]: s for t, s in expected.items()}  # as R2E-Gym compares them
    return make_task(
        NAME,
        instance_id=f"{repo}__{commit[:12]}",
        repo=repo,
        base_commit=commit,
        problem_statement=field(row, "problem_statement", dataset=NAME),
        test_patch="",
        FAIL_TO_PASS=sorted(t for t, s in expected.items() if str(s).upper() == "PASSED"),
        image=field(row, "docker_image", dataset=NAME),
        workdir="/testbed",
        test_cmd="bash /root/run_tests.sh",
        log_parser=f"r2e:{repo}",
    )


PROCEDURE = Procedure(
    reproduced=False,
    instead="the row's run_tests.sh left in the tree and parsed by SWE-bench's "
    "pytest parser; R2E-Gym's hiding of the tests and exact match of every expected status "
    "are not applied",
)
SPEC = DatasetSpec(
    NAME,
    "R2E-Gym/R2E-Gym-Subset",
    "train",
    to_task=to_task,
    procedure=PROCEDURE,
    matches=lambda row: "expected_output_json" in row and "docker_image" in row,
)

"""SWE-smith (``SWE-bench/SWE-smith``): synthetic bugs in a repository snapshot.

Checked against the ``swesmith`` package 0.0.9 (PyPI; ``profiles/base.py``, ``profiles/python.py``,
``harness/utils.py``, ``harness/eval.py``) and github.com/SWE-bench/SWE-smith@cf2e649
(``harness/gather.py``, which writes the rows). A row: ``instance_id``
(``<owner>__<repo>.<sha8>.<strategy>``), ``repo`` (the mirror, ``swesmith/<owner>__<repo>.<sha8>``),
``patch`` (the diff that *introduces* the bug), ``FAIL_TO_PASS``, ``PASS_TO_PASS`` (lists),
``created_at``, ``image_name``, ``base_commit``, ``problem_statement``. ``image_name`` is the
profile's image, ``<org>/swesmith.x86_64.<owner>_1776_<repo>.<sha8>`` (``jyangballin/`` on the
published rows, ``swebench/`` for newer builds); the repository is at ``/testbed``.

The harness runs ``git fetch; git checkout <instance_id>``: each instance is a branch of that name (the
bug commit, then a commit removing the FAIL_TO_PASS test files), so the branch is this task's
``base_commit``; grading goes to ``HEAD~1`` (the tests back), applies the patch, resets the test files
and runs the profile's ``test_cmd`` (the whole suite unless ``--f2p_only``), parsed by the profile's
``log_parser`` (``<test> STATUS`` lines of pytest's ``--verbose`` output, not SWE-bench's ``-rA``
summary). The gold fix is the bug patch reversed (``git apply --reverse``). So the branch's ancestors
are the answer, and the agent gets its tree alone (``runtime.history_target``, sandbox/history.py). Only
Python profiles' test command is known here (``SWE-bench/SWE-smith`` is the Python set; SWE-smith-go and
others are not).
"""

from __future__ import annotations

from polar_env.tasks.datasets.base import DatasetSpec, Procedure, field, make_task
from polar_env.tasks.models import Task

NAME = "swe-smith"
# swesmith/profiles/python.py: PythonProfile.test_cmd (ENV_NAME = "testbed")
TEST_CMD = (
    "source /opt/miniconda3/bin/activate; conda activate testbed; "
    "pytest --disable-warnings --color=no --tb=no --verbose"
)


def to_task(row: dict) -> Task:
    iid = field(row, "instance_id", dataset=NAME)
    return make_task(
        NAME,
        instance_id=iid,
        repo=field(row, "repo", dataset=NAME),
        base_commit=iid,
        problem_statement=field(row, "problem_statement", dataset=NAME),
        test_patch="",
        FAIL_TO_PASS=field(row, "FAIL_TO_PASS", list, dataset=NAME),
        PASS_TO_PASS=field(row, "PASS_TO_PASS", list, dataset=NAME),
        image=field(row, "image_name", dataset=NAME),
        workdir="/testbed",
        test_cmd=TEST_CMD,
        log_parser="swesmith:pytest-verbose",
    )


# not reproduced: SWE-smith's tests come back at HEAD~1 of the instance branch (no test patch in the
# row) and are read from pytest's --verbose lines; Polar's procedure applies a test patch and reads -rA.
PROCEDURE = Procedure(
    reproduced=False,
    instead="SWE-bench's procedure at the instance branch (a test patch "
    "applied, the -rA summary read), not SWE-smith's (tests back at HEAD~1, the --verbose parser)",
)
SPEC = DatasetSpec(
    NAME,
    "SWE-bench/SWE-smith",
    "train",
    to_task=to_task,
    procedure=PROCEDURE,
    matches=lambda row: "image_name" in row and str(row.get("repo", "")).startswith("swesmith/"),
)

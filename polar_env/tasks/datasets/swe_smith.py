"""SWE-smith (``SWE-bench/SWE-smith``): synthetic bugs in a repository snapshot.

A row names the bug (``instance_id`` like ``<owner>__<repo>.<sha8>.<strategy>``), its ``repo``
(``swesmith/<owner>__<repo>.<sha8>``), the ``patch`` that *introduces* the bug, ``FAIL_TO_PASS``,
``PASS_TO_PASS``, ``problem_statement`` and the ``image_name`` of the snapshot's environment
(``jyangballin/swesmith.x86_64.<owner>_1776_<repo>.<sha8>``), repository at ``/testbed``. SWE-smith's
harness checks out the instance's branch (named as the instance id) before the agent runs, so that
is the ``base_commit``; tests are already in the tree (no test patch), run with SWE-smith's pytest
command and parsed by pytest's parser. The gold fix is the bug patch reversed (not stored here).
"""

from __future__ import annotations

from polar_env.tasks.datasets.base import DatasetSpec, field, make_task
from polar_env.tasks.models import Task

NAME = "swe-smith"
TEST_CMD = "pytest --disable-warnings --color=no --tb=no --verbose"


def to_task(row: dict) -> Task:
    iid = field(row, "instance_id", dataset=NAME)
    return make_task(NAME, instance_id=iid, repo=field(row, "repo", dataset=NAME), base_commit=iid,
                     problem_statement=field(row, "problem_statement", dataset=NAME), test_patch="",
                     FAIL_TO_PASS=field(row, "FAIL_TO_PASS", list, dataset=NAME),
                     PASS_TO_PASS=field(row, "PASS_TO_PASS", list, dataset=NAME),
                     image=field(row, "image_name", dataset=NAME), workdir="/testbed", test_cmd=TEST_CMD,
                     test_directives=["."], log_parser="pytest")


SPEC = DatasetSpec(NAME, "SWE-bench/SWE-smith", "train", to_task=to_task,
                   matches=lambda row: "image_name" in row and str(row.get("repo", "")).startswith("swesmith/"))

"""SWE-Gym (``SWE-Gym/SWE-Gym``): SWE-bench's schema; OpenHands' images, ``__`` written ``_s_``.

Rows carry SWE-bench's columns (``instance_id``, ``repo``, ``base_commit``, ``patch``, ``test_patch``,
``problem_statement``, ``FAIL_TO_PASS``/``PASS_TO_PASS`` as JSON strings, ``version``). Images:
``xingyaoww/sweb.eval.x86_64.<instance_id with __ as _s_>`` with the repository at ``/testbed``;
tests and log parser are SWE-bench's for the repository (the pinned ``swebench`` package).
"""

from __future__ import annotations

from polar_env.tasks.datasets.base import DatasetSpec, field, make_task
from polar_env.tasks.models import Task

NAME = "swe-gym"


def image(instance_id: str) -> str:
    return f"xingyaoww/sweb.eval.x86_64.{instance_id.replace('__', '_s_')}"


def to_task(row: dict) -> Task:
    iid = field(row, "instance_id", dataset=NAME)
    return make_task(NAME, instance_id=iid, repo=field(row, "repo", dataset=NAME),
                     version=str(row.get("version") or ""), base_commit=field(row, "base_commit", dataset=NAME),
                     problem_statement=field(row, "problem_statement", dataset=NAME),
                     hints_text=row.get("hints_text") or "", patch=field(row, "patch", dataset=NAME),
                     test_patch=field(row, "test_patch", dataset=NAME),
                     FAIL_TO_PASS=field(row, "FAIL_TO_PASS", list, dataset=NAME),
                     PASS_TO_PASS=field(row, "PASS_TO_PASS", list, dataset=NAME), image=image(iid),
                     workdir="/testbed")


SPEC = DatasetSpec(NAME, "SWE-Gym/SWE-Gym", "train", matches=lambda row: False, to_task=to_task)

"""Multi-SWE-bench (``ByteDance-Seed/Multi-SWE-bench``): pull requests in seven languages.

Checked against the ``multi-swe-bench`` package 1.1.2 (PyPI; ``harness/dataset.py``,
``harness/pull_request.py``, ``harness/test_result.py``, ``harness/image.py``,
``harness/repos/<language>/<org>/<repo>.py``) and github.com/multi-swe-bench/multi-swe-bench@24f493f
(``utils/meta_info.py``). A row (one JSONL line of ``<language>/<org>__<repo>_dataset.jsonl``) has
``instance_id`` (``<org>__<repo>-<number>``), ``org``, ``repo``, ``number``, ``state``, ``title``, ``body``,
``base`` (``{label, ref, sha}``: ``sha`` is the base commit), ``resolved_issues`` (``[{number, title,
body}]``: the issue text), ``fix_patch`` (the gold patch), ``test_patch``, ``fixed_tests``, ``p2p_tests``,
``f2p_tests``, ``s2p_tests``, ``n2p_tests`` (test name -> ``{run, test, fix}`` statuses),
``run_result``/``test_patch_result``/``fix_patch_result`` and, since 2025-09, ``hints``; the language is
the file's directory, not a column. Images: ``mswebench/<org>_m_<repo>:pr-<number>`` (lower-cased), the
repository at ``/home/<repo>``; ``/home/fix-run.sh`` applies ``/home/test.patch`` and
``/home/fix.patch`` (the patch under test) itself and runs the tests, parsed by that repository's
``Instance.parse_log``; resolved when every test of ``p2p_tests``, ``f2p_tests``, ``s2p_tests`` and
``n2p_tests`` is in the same class again (``gen_report.py``): FAIL_TO_PASS here is f2p, s2p and n2p together
(skipped or absent before, passing after). Polar's grading (a test patch applied in /testbed) is not that:
schema only.
"""

from __future__ import annotations

from polar_env.tasks.datasets.base import (
    NO_DIRECTIVES,
    DatasetSpec,
    Procedure,
    field,
    make_task,
    raise_missing,
)
from polar_env.tasks.models import Task

NAME = "multi-swe-bench"


def image(org: str, repo: str, number: int) -> str:
    return f"mswebench/{org}_m_{repo}".lower() + f":pr-{number}"


def _tests(row: dict, name: str) -> dict:
    return field(row, name, dict, dataset=NAME) if row.get(name) is not None else {}


def to_task(row: dict) -> Task:
    org, repo = field(row, "org", dataset=NAME), field(row, "repo", dataset=NAME)
    number = field(row, "number", int, dataset=NAME)
    iid = row.get("instance_id") or f"{org}__{repo}-{number}"
    base = field(row, "base", dict, dataset=NAME)
    if not isinstance(base.get("sha"), str) or not base["sha"]:
        raise_missing(NAME, iid, "base.sha")
    issues = field(row, "resolved_issues", list, dataset=NAME)
    statement = (
        "\n\n".join(
            f"{i.get('title', '')}\n{i.get('body') or ''}".strip() for i in issues if isinstance(i, dict)
        )
        or f"{row.get('title', '')}\n{row.get('body') or ''}".strip()
    )
    return make_task(
        NAME,
        instance_id=iid,
        repo=f"{org}/{repo}",
        base_commit=base["sha"],
        problem_statement=statement,
        hints_text=str(row.get("hints") or ""),
        patch=field(row, "fix_patch", dataset=NAME),
        test_patch=field(row, "test_patch", dataset=NAME),
        FAIL_TO_PASS=sorted(
            {
                *field(row, "f2p_tests", dict, dataset=NAME),
                *_tests(row, "s2p_tests"),
                *_tests(row, "n2p_tests"),
            }
        ),
        PASS_TO_PASS=sorted(field(row, "p2p_tests", dict, dataset=NAME)),
        image=image(org, repo, number),
        workdir=f"/home/{repo}",
        test_cmd="bash /home/fix-run.sh",
        test_directives=NO_DIRECTIVES,
        log_parser=f"multi-swe-bench:{org}/{repo}",
    )


PROCEDURE = Procedure(
    reproduced=False,
    instead="SWE-bench's procedure in /home/<repo> with the row's test command and SWE-bench's pytest "
    "parser, not the image's own flow (fix-run.sh applying the patches it holds) nor the repository's "
    "parse_log",
)
SPEC = DatasetSpec(
    NAME,
    "ByteDance-Seed/Multi-SWE-bench",
    "train",
    to_task=to_task,
    procedure=PROCEDURE,
    matches=lambda row: "fix_patch" in row and "org" in row and "number" in row,
)

"""Multi-SWE-bench (``ByteDance-Seed/Multi-SWE-bench``): pull requests in seven languages.

A row has ``org``, ``repo``, ``number``, ``instance_id`` (``<org>__<repo>-<number>``),
``resolved_issues`` (``[{number, title, body}]``: the issue text), ``fix_patch`` (the gold patch),
``test_patch``, ``f2p_tests``/``p2p_tests`` (test name -> ``{run, test, fix}`` statuses) and
``language``. Images: ``mswebench/<org>_m_<repo>:pr-<number>``, the repository at ``/home/<repo>``,
tests by the image's own ``/home/fix-run.sh``; each language has its own log parser in the
Multi-SWE-bench harness (``log_parser`` names it). Polar grades with pytest-style parsers only,
so only Python rows are graded here; the rest are mapped by schema.
"""

from __future__ import annotations

from polar_env.tasks.datasets.base import DatasetSpec, field, make_task
from polar_env.tasks.models import Task

NAME = "multi-swe-bench"


def image(org: str, repo: str, number: int) -> str:
    return f"mswebench/{org.lower()}_m_{repo.lower()}:pr-{number}"


def to_task(row: dict) -> Task:
    org, repo = field(row, "org", dataset=NAME), field(row, "repo", dataset=NAME)
    number = field(row, "number", int, dataset=NAME)
    issues = field(row, "resolved_issues", list, dataset=NAME)
    statement = "\n\n".join(f"{i.get('title', '')}\n{i.get('body') or ''}".strip() for i in issues
                            if isinstance(i, dict)) or f"{row.get('title', '')}\n{row.get('body') or ''}".strip()
    language = str(row.get("language") or "unknown").lower()
    return make_task(NAME, instance_id=row.get("instance_id") or f"{org}__{repo}-{number}", repo=f"{org}/{repo}",
                     base_commit=str((row.get("base") or {}).get("sha", "")), problem_statement=statement,
                     patch=field(row, "fix_patch", dataset=NAME), test_patch=field(row, "test_patch", dataset=NAME),
                     FAIL_TO_PASS=sorted(field(row, "f2p_tests", dict, dataset=NAME)),
                     PASS_TO_PASS=sorted(field(row, "p2p_tests", dict, dataset=NAME)), image=image(org, repo, number),
                     workdir=f"/home/{repo}", test_cmd="bash /home/fix-run.sh",
                     log_parser="pytest" if language == "python" else f"multi-swe-bench:{language}")


SPEC = DatasetSpec(NAME, "ByteDance-Seed/Multi-SWE-bench", "train", to_task=to_task, graded_here=False,
                   matches=lambda row: "fix_patch" in row and "org" in row and "number" in row)

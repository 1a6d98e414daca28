"""SWE-bench Pro (``ScaleAI/SWE-bench_Pro``): SWE-bench's shape in lower case, images by tag, /app.

A row has ``instance_id``, ``repo``, ``base_commit``, ``patch``, ``test_patch``, ``problem_statement``
plus ``requirements`` and ``interface`` (both part of what the agent is told), ``repo_language``,
``fail_to_pass``/``pass_to_pass`` (JSON strings), ``selected_test_files_to_run`` and
``dockerhub_tag``: the image is ``jefzda/sweap-images:<dockerhub_tag>``, the repository at ``/app``
(its git history sanitized). Its tests run with the per-instance ``run_script.sh`` and
``parser.py`` of the SWE-bench Pro repository, which are not in the row: schema only here.
"""

from __future__ import annotations

from polar_env.tasks.datasets.base import DatasetSpec, field, make_task
from polar_env.tasks.models import Task

NAME = "swe-bench-pro"
IMAGE_REPO = "jefzda/sweap-images"


def prompt(row: dict) -> str:
    parts = [field(row, "problem_statement", dataset=NAME)]
    for key, title in (("requirements", "Requirements"), ("interface", "New interfaces")):
        if str(row.get(key) or "").strip():
            parts.append(f"{title}:\n{row[key].strip()}")
    return "\n\n".join(parts)


def to_task(row: dict) -> Task:
    files = field(row, "selected_test_files_to_run", list, dataset=NAME) if "selected_test_files_to_run" in row else []
    return make_task(NAME, instance_id=field(row, "instance_id", dataset=NAME), repo=field(row, "repo", dataset=NAME),
                     base_commit=field(row, "base_commit", dataset=NAME), problem_statement=prompt(row),
                     patch=field(row, "patch", dataset=NAME), test_patch=field(row, "test_patch", dataset=NAME),
                     FAIL_TO_PASS=field(row, "fail_to_pass", list, dataset=NAME),
                     PASS_TO_PASS=field(row, "pass_to_pass", list, dataset=NAME),
                     image=f"{IMAGE_REPO}:{field(row, 'dockerhub_tag', dataset=NAME)}", workdir="/app",
                     test_cmd="bash /run_scripts/run_script.sh", test_directives=[str(f) for f in files],
                     log_parser=f"swe-bench-pro:{row.get('repo_language') or 'python'}")


SPEC = DatasetSpec(NAME, "ScaleAI/SWE-bench_Pro", "test", to_task=to_task, graded_here=False,
                   matches=lambda row: "dockerhub_tag" in row)

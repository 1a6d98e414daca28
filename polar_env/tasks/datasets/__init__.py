"""Loaders for the SWE datasets users train on beside Verified, one module per dataset.

Each module maps one row of its dataset's own schema to a Polar :class:`~polar_env.tasks.models.Task`:
the image its convention names, the repository's path inside that image (``workdir``), the test
command and the log parser. ``--tasks NAME[:split]`` loads a dataset through ``datasets`` (where a
hub is reachable); ``--tasks FILE.jsonl`` of rows copied from one is recognised row by row
(:func:`detect`), SWE-bench-schema rows keep their own path. Each task keeps its loader's name
(``Task.dataset``), so grading runs that dataset's procedure (:class:`Procedure`); where Polar does not
reproduce it, loading says so once (:func:`notice_unreproduced`). docs/tasks.md lists what each loader
was verified against and what is verified where.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from polar_env.tasks.datasets.base import DatasetRowError, DatasetSpec, Procedure
from polar_env.tasks.datasets.multi_swe_bench import SPEC as MULTI_SWE_BENCH
from polar_env.tasks.datasets.r2e_gym import SPEC as R2E_GYM
from polar_env.tasks.datasets.swe_bench_pro import SPEC as SWE_BENCH_PRO
from polar_env.tasks.datasets.swe_gym import SPEC as SWE_GYM
from polar_env.tasks.datasets.swe_rebench import SPEC as SWE_REBENCH
from polar_env.tasks.datasets.swe_rebench import SPEC_V2 as SWE_REBENCH_V2
from polar_env.tasks.datasets.swe_smith import SPEC as SWE_SMITH
from polar_env.tasks.models import Task

log = logging.getLogger(__name__)

# detection order matters: the most specific schemas first
DATASETS: dict[str, DatasetSpec] = {
    s.name: s
    for s in (SWE_BENCH_PRO, MULTI_SWE_BENCH, R2E_GYM, SWE_SMITH, SWE_REBENCH_V2, SWE_REBENCH, SWE_GYM)
}


def detect(row: dict) -> DatasetSpec | None:
    """The dataset whose schema ``row`` has (None: a SWE-bench-schema row, loaded as one)."""
    return next((s for s in DATASETS.values() if s.matches(row)), None)


# SWE-bench's own rows (Verified, bundled, Polar-built): the procedure image_grading.py was written for
SWE_BENCH = Procedure(verified="the bundled tasks, in bubblewrap and in their images, in CI")
_noticed: set[str] = set()


def procedure_of(task: Task) -> Procedure:
    """The procedure ``task`` is graded by: its dataset's (as it applies to the row), else SWE-bench's."""
    return DATASETS[task.dataset].procedure.for_task(task) if task.dataset in DATASETS else SWE_BENCH


def notice_unreproduced(tasks: Iterable[Task]) -> None:
    """Say once per process, per dataset (and per reason), that its tasks are not graded its own way, and
    how they are."""
    for task in tasks:
        proc = procedure_of(task)
        if proc.reproduced or (key := f"{task.dataset}\0{proc.instead}") in _noticed:
            continue
        _noticed.add(key)
        log.warning(
            "%s: Polar does not reproduce this dataset's own grading procedure%s; instead: %s",
            task.dataset,
            "" if proc is DATASETS[task.dataset].procedure else f" for {task.instance_id} and rows like it",
            proc.instead,
        )


__all__ = [
    "DATASETS",
    "SWE_BENCH",
    "DatasetRowError",
    "DatasetSpec",
    "Procedure",
    "detect",
    "notice_unreproduced",
    "procedure_of",
]

"""Loaders for the SWE datasets users train on beside Verified, one module per dataset.

Each module maps one row of its dataset's own schema to a Polar :class:`~polar_env.tasks.models.Task`:
the image its convention names, the repository's path inside that image (``workdir``), the test
command and the log parser. ``--tasks NAME[:split]`` loads a dataset through ``datasets`` (where a
hub is reachable); ``--tasks FILE.jsonl`` of rows copied from one is recognised row by row
(:func:`detect`), SWE-bench-schema rows keep their own path. docs/tasks.md lists what each loader
was verified against (the schema only: no hub and none of these images are reachable here).
"""

from __future__ import annotations

from polar_env.tasks.datasets.base import DatasetRowError, DatasetSpec
from polar_env.tasks.datasets.multi_swe_bench import SPEC as MULTI_SWE_BENCH
from polar_env.tasks.datasets.r2e_gym import SPEC as R2E_GYM
from polar_env.tasks.datasets.swe_bench_pro import SPEC as SWE_BENCH_PRO
from polar_env.tasks.datasets.swe_gym import SPEC as SWE_GYM
from polar_env.tasks.datasets.swe_rebench import SPEC as SWE_REBENCH
from polar_env.tasks.datasets.swe_rebench import SPEC_V2 as SWE_REBENCH_V2
from polar_env.tasks.datasets.swe_smith import SPEC as SWE_SMITH

# detection order matters: the most specific schemas first
DATASETS: dict[str, DatasetSpec] = {s.name: s for s in (
    SWE_BENCH_PRO, MULTI_SWE_BENCH, R2E_GYM, SWE_SMITH, SWE_REBENCH_V2, SWE_REBENCH, SWE_GYM)}


def detect(row: dict) -> DatasetSpec | None:
    """The dataset whose schema ``row`` has (None: a SWE-bench-schema row, loaded as one)."""
    return next((s for s in DATASETS.values() if s.matches(row)), None)


__all__ = ["DATASETS", "DatasetRowError", "DatasetSpec", "detect"]

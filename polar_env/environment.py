"""Polar's own environment variables, read in this one typed place (``EnvSettings.read()``). Read at the
moment of use, not at import, so a test or a launcher that sets one before the call is obeyed."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, Field

GRADING_PREFIX = "POLAR_GRADING_"
PYTHON_PREFIX = "POLAR_PYTHON"


class EnvSettings(BaseModel):
    """Each field: the variable it is read from, and what unset means."""

    admin_secret: str | None = Field(
        default=None, repr=False
    )  # POLAR_ADMIN_SECRET: the admin API's Bearer secret
    cache: Path | None = (
        None  # POLAR_CACHE: harness installs, the embedded model, task envs (default ~/.cache/polar)
    )
    base_cache: Path | None = None  # POLAR_BASE_CACHE: task base trees (default $POLAR_CACHE/bases)
    gold_cache: Path | None = None  # POLAR_GOLD_CACHE: gold runs (default $POLAR_CACHE/gold)
    container_labels: str = ""  # POLAR_CONTAINER_LABELS: comma-separated key=value labels on every container
    image_map: str = ""  # POLAR_IMAGE_MAP: comma-separated NAME=LOCAL_IMAGE pairs for Harbor tasks
    # POLAR_SWE_BENCH_PRO_SCRIPTS: SWE-bench_Pro-os's run_scripts/ (default: run_scripts/ beside the rows)
    pro_scripts: Path | None = None
    # POLAR_GRADING_MEMORY_BYTES / _PIDS_MAX / _TMPFS_BYTES / _TIMEOUT_S: the grading limits
    # (rewards/sandbox_exec.py)
    grading: dict[str, str] = {}
    # POLAR_PYTHON<major>_<minor> (POLAR_PYTHON3_12): the host CPython a portable-Python harness copies,
    # by its major.minor ("3.12"; harness_adapters/sources.py)
    python: dict[str, str] = {}

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> EnvSettings:
        env = os.environ if environ is None else environ
        return cls.model_validate(
            {  # the strings validated into the fields' types (paths)
                "admin_secret": env.get("POLAR_ADMIN_SECRET") or None,
                "cache": env.get("POLAR_CACHE") or None,
                "base_cache": env.get("POLAR_BASE_CACHE") or None,
                "gold_cache": env.get("POLAR_GOLD_CACHE") or None,
                "container_labels": env.get("POLAR_CONTAINER_LABELS", ""),
                "image_map": env.get("POLAR_IMAGE_MAP", ""),
                "pro_scripts": env.get("POLAR_SWE_BENCH_PRO_SCRIPTS") or None,
                "grading": {
                    k.removeprefix(GRADING_PREFIX): v for k, v in env.items() if k.startswith(GRADING_PREFIX)
                },
                "python": {
                    k.removeprefix(PYTHON_PREFIX).replace("_", "."): v
                    for k, v in env.items()
                    if k.startswith(PYTHON_PREFIX) and k != PYTHON_PREFIX and v
                },
            }
        )

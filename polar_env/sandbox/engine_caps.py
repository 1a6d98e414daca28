"""What this machine's container engine can enforce beyond cpus and memory: a size limit on a
container's writable layer, and NVIDIA GPUs (a Harbor task's ``[environment] storage_mb`` and ``gpus``).

``--storage-opt size=`` works only on some storage drivers (overlay over xfs mounted with ``pquota``,
btrfs, ...), so it is probed once per engine and image with a container that is created and removed;
where it fails the limit is not enforced and a warning says so. GPUs are counted with ``nvidia-smi -L``;
podman reaches them through a CDI spec (``nvidia-ctk cdi generate``), which must exist too.
"""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess
import uuid
from pathlib import Path

from polar_env.sandbox.container import label_args

log = logging.getLogger(__name__)
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))


@functools.cache
def storage_limit_supported(engine: str, image: str) -> bool:
    """Whether ``engine`` creates a container of ``image`` with ``--storage-opt size=``."""
    name = f"polar-probe-{uuid.uuid4().hex[:8]}"
    try:
        ok = (
            subprocess.run(
                [engine, "create", "--name", name, *label_args(), "--storage-opt", "size=1g", image, "true"],
                capture_output=True,
                timeout=120,
            ).returncode
            == 0
        )
        subprocess.run([engine, "rm", "-f", name], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if not ok:
        log.warning(
            "%s cannot limit a container's storage here (--storage-opt size= needs e.g. overlay over xfs "
            "with pquota): [environment] storage_mb is not enforced",
            engine,
        )
    return ok


def gpu_count() -> int:
    """How many NVIDIA GPUs ``nvidia-smi -L`` lists (0 without it)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def cdi_has_nvidia() -> bool:
    """Whether a CDI spec names NVIDIA GPUs (podman's ``--device nvidia.com/gpu=<i>`` needs one)."""
    return any(
        "nvidia.com/gpu" in p.read_text(errors="replace")
        for d in CDI_DIRS
        if d.is_dir()
        for p in sorted(d.iterdir())
        if p.suffix in (".yaml", ".yml", ".json")
    )


def gpu_problem(wanted: int, engine: str) -> str | None:
    """Why ``wanted`` GPUs cannot be given to a container of ``engine`` here, or None."""
    have = gpu_count()
    if have < wanted:
        return f"it asks for {wanted} GPU(s) and this machine has {have} (nvidia-smi -L)"
    if engine == "podman" and not cdi_has_nvidia():
        return (
            "podman reaches GPUs through a CDI spec and there is none for nvidia.com/gpu "
            f"in {' or '.join(map(str, CDI_DIRS))} (nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml)"
        )
    return None

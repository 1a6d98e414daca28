"""This test process's containers: every container it (or a polar CLI or Gym server it starts)
creates carries a label unique to the process, so test files that use podman can run at once and
each counts only its own. Imported by conftest before any test runs."""

from __future__ import annotations

import os
import subprocess
import uuid

LABEL = f"polar_test={uuid.uuid4().hex[:12]}"
os.environ["POLAR_CONTAINER_LABELS"] = LABEL


def own_containers(engine: str) -> set[str]:
    """Names of this process's containers, running or not."""
    out = subprocess.run(
        [engine, "ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())

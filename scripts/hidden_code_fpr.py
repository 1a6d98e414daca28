"""The ``hidden-code`` flag's false-positive rate on honest code (docs/reliability.md, issue 48).

Every gold patch the repository holds (the bundled tasks, the dataset fixtures), then, as a stress
measure, every module of some installed honest packages read as if a patch added it whole.

    .venv/bin/python scripts/hidden_code_fpr.py [package ...]
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from polar_env.rewards.flags import tampering_flags  # noqa: E402
from polar_env.tasks.loader import load_tasks  # noqa: E402

PACKAGES = (
    "requests flask jinja2 click aiohttp _pytest pluggy urllib3 pydantic attr attrs httpx anyio rich "
    "pygments dateutil jsonschema tomlkit packaging idna certifi charset_normalizer h11 multidict yarl "
    "sympy networkx pandas numpy"
).split()


def gold_patches() -> list[tuple[str, str, str]]:
    golds = [(t.instance_id, t.patch, t.repo) for t in load_tasks("bundled")]
    for path in sorted((ROOT / "tests" / "fixtures" / "datasets").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if patch := row.get("patch") or row.get("fix_patch"):
                golds.append((path.name, patch, str(row.get("repo", ""))))
    return golds


def main() -> None:
    golds = gold_patches()
    flagged = [g[0] for g in golds if "hidden-code" in tampering_flags(g[1], g[2])]
    print(f"gold patches: {len(flagged)} of {len(golds)} flagged hidden-code {flagged}")
    site = Path(sysconfig.get_paths()["purelib"])
    files = [f for pkg in (sys.argv[1:] or PACKAGES) for f in sorted((site / pkg).rglob("*.py"))]
    hits = 0
    for f in files:
        text = f.read_text(errors="replace")
        diff = f"diff --git a/{f.name} b/{f.name}\n" + "".join(
            "+" + line + "\n" for line in text.splitlines()
        )
        hits += "hidden-code" in tampering_flags(diff, "honest/package")
    print(
        f"whole modules of installed packages: {hits} of {len(files)} flagged "
        f"({hits / max(len(files), 1):.2%})"
    )


if __name__ == "__main__":
    main()

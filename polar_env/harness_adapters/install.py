"""`python -m polar_env.harness_adapters.install [all|NAME...]`: install pinned harness CLIs (npm or a Python
venv) once."""

from __future__ import annotations

import sys

from polar_env.harness_adapters.registry import adapter_names, get_adapter


def main(argv: list[str] | None = None) -> int:
    names = list(sys.argv[1:] if argv is None else argv) or ["all"]
    if names == ["all"]:
        names = adapter_names()
    for name in names:
        adapter = get_adapter(name)
        where = adapter.install()
        print(f"harness {adapter.name} {adapter.package} ({adapter.source.kind}): {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

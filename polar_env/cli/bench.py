"""`polar bench`: the benchmarks measure the product and are not part of it, so they live in the
repository's ``bench/`` beside the package; this command runs them from a checkout (``pip install -e .``)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _bench_cli() -> ModuleType:
    if not (REPO / "bench" / "bench_cli.py").is_file():
        raise SystemExit(
            "polar bench: the benchmarks are in the repository's bench/ folder, which an installed "
            f"package does not carry (looked in {REPO}): run it from a checkout, installed with "
            "`pip install -e .`"
        )
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module("bench.bench_cli")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _bench_cli().add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    return _bench_cli().run(args)

"""Where the suite's shared files are, the same from every test file's folder (tests/<package>/)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent  # the suite's root: conftest.py and the shared helpers
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
REDTEAM = TESTS / "redteam"

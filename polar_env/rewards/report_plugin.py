"""The grader's pytest plugin: the structured result report of a `strict` grading run.

Runs INSIDE the grading sandbox, in the task's interpreter, bound read-only at
``/opt/polar-grader/polar_grader_report.py`` and loaded with ``-p polar_grader_report`` (plugin
autoload is off). It imports nothing but the standard library and pytest, and is imported before
any conftest or code under test, so it can:

- take the run's nonce from a pipe the grader passes (the nonce never appears in the environment
  or argv), so a report forged by code under test is recognisable;
- snapshot the runner's moving parts (functions and classes of pytest's reporting, running,
  assertion-rewriting and pluggy modules, the exit functions) and check at every
  teardown and at the end that nothing replaced them, and that every test module was loaded
  from its own file by pytest's rewriter or the standard loader;
- note where every registered plugin comes from (the grader judges the origins);
- count an xfail as XFAIL only when the test itself (or a conftest) raised it: an imperative
  ``pytest.xfail`` from the code under test is a FAILED test;
- write per-test outcomes (SWE-bench's status names) plus the runner's own counts and exit status
  to the report path outside the tree, at the very end of the session.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

_NONCE_FD_ENV = "POLAR_GRADER_NONCE_FD"
_REPORT_ENV = "POLAR_GRADER_REPORT"
_WATCHED_MODULES = (
    "_pytest.runner", "_pytest.reports", "_pytest.python", "_pytest.main", "_pytest.terminal",
    "_pytest.skipping", "_pytest.outcomes", "_pytest.assertion", "_pytest.assertion.rewrite",
    "_pytest.assertion.util", "_pytest.capture", "_pytest.nodes", "_pytest.fixtures", "_pytest.unittest",
    "_pytest.junitxml", "_pytest.warnings", "pluggy", "pluggy._hooks",
    "pluggy._callers", "pluggy._manager", "pytest",
)
_WATCHED_ATTRS = {"os": ("_exit", "exit", "kill", "abort"), "sys": ("exit", "excepthook"),
                  "builtins": ("AssertionError", "print", "__import__", "exit", "open", "compile", "exec")}
_PLAIN = (int, float, str, bytes, bool, type(None), dict, list, set, tuple)


def _take_nonce() -> str:
    fd = os.environ.pop(_NONCE_FD_ENV, "")
    if not fd:
        return ""
    try:
        return os.read(int(fd), 128).decode("ascii", "replace").strip()
    finally:
        os.close(int(fd))


def _snapshot() -> dict[str, int]:
    """id() of every callable/class the run's outcome depends on, and of their class members."""
    snap: dict[str, int] = {}
    for name in _WATCHED_MODULES:
        mod = sys.modules.get(name)
        if mod is None:
            continue
        for attr, obj in list(vars(mod).items()):
            if isinstance(obj, _PLAIN) or type(obj).__name__ == "module":
                continue
            snap[f"{name}.{attr}"] = id(obj)
            if isinstance(obj, type) and getattr(obj, "__module__", "") == name:
                for member, value in list(vars(obj).items()):
                    if not isinstance(value, _PLAIN):
                        snap[f"{name}.{attr}.{member}"] = id(value)
    for name, attrs in _WATCHED_ATTRS.items():
        mod = sys.modules[name]
        for attr in attrs:
            if hasattr(mod, attr):
                snap[f"{name}.{attr}"] = id(getattr(mod, attr))
    return snap


_LOADER_MODULES = ("_pytest.assertion.rewrite", "importlib._bootstrap_external", "_frozen_importlib_external")


def _foreign_test_modules(session: pytest.Session) -> list[str]:
    """Test modules not loaded from their own file by pytest's rewriter or the standard loader.

    An import hook planted by code under test (a finder ahead of pytest's, a loader that edits
    the code) shows up here; other finders packages install (six's, for instance) do not matter.
    """
    seen: dict[str, str] = {}
    for item in getattr(session, "items", []):
        mod = getattr(item, "module", None)
        if mod is None or mod.__name__ in seen:
            continue
        loader = getattr(mod, "__loader__", None)
        origin = os.path.realpath(getattr(mod, "__file__", "") or "")
        if type(loader).__module__ not in _LOADER_MODULES or origin != os.path.realpath(str(item.path)):
            seen[mod.__name__] = f"test-module-loader: {mod.__name__} via {type(loader).__module__}"
    return sorted(seen.values())


class _State:
    def __init__(self) -> None:
        self.nonce = _take_nonce()
        self.report_path = os.environ.pop(_REPORT_ENV, "")
        # Taken on import: `-p` loads this module before any conftest or code under test runs.
        self.snapshot = _snapshot()
        self.tampered: set[str] = set()
        self.plugins: set[str] = set()
        self.statuses: dict[str, str] = {}
        self.failed_reports = 0
        self.untrusted_xfail: set[str] = set()

    def check(self) -> None:
        now = _snapshot()
        for key, ident in self.snapshot.items():
            if now.get(key) != ident:
                self.tampered.add(key)
        if sys.gettrace() is not None or sys.getprofile() is not None:
            self.tampered.add("sys.settrace/setprofile")


_STATE = _State()


def _plugin_origin(plugin: object) -> str:
    mod = plugin if type(plugin).__name__ == "module" else sys.modules.get(type(plugin).__module__)
    return str(getattr(mod, "__file__", "") or getattr(mod, "__name__", "") or type(plugin).__qualname__)


def pytest_plugin_registered(plugin: object, manager: object) -> None:
    """Every plugin, including those registered before this module (pluggy replays them)."""
    _STATE.plugins.add(_plugin_origin(plugin))


def _raised_from(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    """The file of the innermost frame outside pytest that led to the exception."""
    for entry in reversed(list(excinfo.traceback)):
        path = str(entry.path)
        if "/_pytest/" not in path and "/pytest/" not in path:
            return os.path.realpath(path)
    return ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """An xfail only counts when the test or a conftest raised it, not the code under test."""
    yield
    excinfo = call.excinfo
    if excinfo is not None and excinfo.errisinstance(pytest.xfail.Exception):
        origin = _raised_from(excinfo)
        if origin != os.path.realpath(str(item.path)) and not origin.endswith("/conftest.py"):
            _STATE.untrusted_xfail.add(item.nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    nodeid, when = report.nodeid, report.when
    wasxfail = hasattr(report, "wasxfail")
    if report.failed:
        _STATE.failed_reports += 1
        status = "FAILED" if when == "call" else "ERROR"
    elif report.skipped and wasxfail and nodeid in _STATE.untrusted_xfail:
        status = "FAILED"
    elif report.skipped:
        status = "XFAIL" if wasxfail else "SKIPPED"
    elif when == "call":
        status = "XPASS" if wasxfail else "PASSED"
    else:
        status = ""
    previous = _STATE.statuses.get(nodeid, "")
    # A failing phase outranks a passing one (call passed + teardown error = ERROR).
    if status and previous not in ("FAILED", "ERROR"):
        _STATE.statuses[nodeid] = status
    if when == "teardown":
        _STATE.check()


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _STATE.failed_reports += 1


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _STATE.check()
    _STATE.tampered.update(_foreign_test_modules(session))
    if not _STATE.report_path:
        return
    report = {
        "nonce": _STATE.nonce,
        "exitstatus": int(exitstatus),
        "testscollected": int(session.testscollected),
        "testsfailed": int(session.testsfailed),
        "failed_reports": _STATE.failed_reports,
        "statuses": _STATE.statuses,
        "tampered": sorted(_STATE.tampered),
        "plugins": sorted(_STATE.plugins),
        "untrusted_xfail": sorted(_STATE.untrusted_xfail),
        "finished": True,
    }
    with open(_STATE.report_path, "w", encoding="utf-8") as f:
        json.dump(report, f)

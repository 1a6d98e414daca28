"""The grader's pytest plugin: the result stream of a `strict` grading run.

Runs INSIDE the grading sandbox, in the task's interpreter, bound read-only beside the grader's
ini and loaded with ``-p`` (plugin autoload is off). It imports nothing but the standard library
and pytest, and is imported before any conftest or code under test, so it can:

- take the run's configuration (nonce, perturbation) from a pipe the grader fills and
  closes (nothing of it is in the environment or argv), and the write end of the result pipe,
  whose read end only the grader outside the sandbox holds; both fds are made non-inheritable;
- write every report phase, the collected ids, each plugin's origin and every tampering it sees as
  one numbered line the moment it happens: what is written cannot be unwritten, so an attack
  that edits results later (at exit, in a report file, in this module's state) has nothing to edit,
  and a line injected by the tested code breaks the numbering or duplicates a result;
- snapshot the runner's moving parts and the exit functions and report any replacement, by identity
  and by content: what a function runs (its code's bytes, constants and names, its defaults and the
  functions in its closure), so a ``__code__`` swapped in place on the same function object is seen;
- in a perturbed run, hide what pytest would show a test-run detector (``PYTEST_CURRENT_TEST``, the
  autoload switch).

The grader, not this plugin, turns the phases into statuses and judges them (strict_run). It is
told nothing of the canaries (`canaries`): they are tests in the files like any other.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import types
from typing import Any

import pytest

_CONFIG_FD_ENV = "POLAR_GRADER_CONFIG_FD"
_RESULT_FD_ENV = "POLAR_GRADER_RESULT_FD"
_WATCHED_MODULES = (
    "_pytest.runner",
    "_pytest.reports",
    "_pytest.python",
    "_pytest.main",
    "_pytest.terminal",
    "_pytest.skipping",
    "_pytest.outcomes",
    "_pytest.assertion",
    "_pytest.assertion.rewrite",
    "_pytest.assertion.util",
    "_pytest.capture",
    "_pytest.nodes",
    "_pytest.fixtures",
    "_pytest.unittest",
    "_pytest.junitxml",
    "_pytest.warnings",
    "pluggy",
    "pluggy._hooks",
    "pluggy._callers",
    "pluggy._manager",
    "pytest",
)
_WATCHED_ATTRS = {
    "os": ("_exit", "exit", "kill", "abort", "write"),
    "sys": ("exit", "excepthook"),
    "builtins": ("AssertionError", "print", "__import__", "exit", "open", "compile", "exec"),
}
_PLAIN = (int, float, str, bytes, bool, type(None), dict, list, set, tuple)
_LOADER_MODULES = ("_pytest.assertion.rewrite", "importlib._bootstrap_external", "_frozen_importlib_external")
_SCALARS = (int, float, str, bytes, bool, type(None))
_os_write, _dumps = os.write, json.dumps  # bound now: later replacements of either do not reach the stream
_sha256 = hashlib.sha256  # bound now, as the stream's writer is


def _take_fd(env: str) -> int:
    fd = os.environ.pop(env, "")
    if not fd:
        return -1
    os.set_inheritable(int(fd), False)
    return int(fd)


def _take_config() -> dict:
    fd = _take_fd(_CONFIG_FD_ENV)
    if fd < 0:
        return {}
    try:
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
        return json.loads(data or b"{}")
    finally:
        os.close(fd)


def _code_digest(code: types.CodeType) -> str:
    digest = _sha256()
    _code(code, digest)
    return digest.hexdigest()


def _code(code: types.CodeType, digest: Any) -> None:
    """A code object's content: instructions, names, flags and constants, nested code included (not
    marshal's bytes: those depend on reference counts)."""
    digest.update(code.co_code)
    digest.update(
        repr(
            (
                code.co_names,
                code.co_varnames,
                code.co_freevars,
                code.co_cellvars,
                code.co_flags,
                code.co_argcount,
                code.co_kwonlyargcount,
            )
        ).encode()
    )
    for const in code.co_consts:
        if code.co_filename.startswith("<") and type(const) is int:
            # generated code (attrs' ``__hash__``) holds a per-process salt: not the runner's content
            continue
        if type(const) is types.CodeType:
            _code(const, digest)
        else:  # a constant is a scalar or a tuple/frozenset of them (a frozenset's order is the hash seed's)
            digest.update(
                b"\0" + (repr(sorted(map(repr, const))) if type(const) is frozenset else repr(const)).encode()
            )


def _content(obj: Any, deep: bool, depth: int = 0) -> str:
    """What a function runs: its code (``deep``: by content, `_code`; else the code object's identity,
    which an in-place ``__code__`` swap changes too), its defaults and the functions in its closure
    cells. Exact types only: reading an attribute of an arbitrary object could run its ``__getattr__``."""
    kind = type(obj)
    if kind in (classmethod, staticmethod, types.MethodType):
        return _content(obj.__func__, deep, depth)
    if kind is property:
        return "|".join(_content(f, deep, depth) for f in (obj.fget, obj.fset, obj.fdel))
    if kind is not types.FunctionType:
        return "" if obj is None or isinstance(obj, _SCALARS) else kind.__qualname__
    if depth > 3:  # by content, the same in every process (`_State.runner`)
        return obj.__qualname__ if deep else str(id(obj))
    parts = [_code_digest(obj.__code__) if deep else str(id(obj.__code__))]
    for value in (*(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()):
        parts.append(repr(value) if type(value) in _SCALARS else _content(value, deep, depth + 1))
    for cell in obj.__closure__ or ():
        try:
            parts.append(_content(cell.cell_contents, deep, depth + 1))
        except ValueError:  # an empty cell
            parts.append("")
    return "(" + ",".join(parts) + ")"


def _snapshot(deep: bool = False) -> dict[str, str]:
    """id() and content (`_content`) of every callable/class the run's outcome depends on, and of their
    class members."""
    snap: dict[str, str] = {}

    def take(key: str, obj: object) -> None:
        snap[key] = f"{id(obj)}:{_content(obj, deep)}"

    for name in (*_WATCHED_MODULES, __name__):
        mod = sys.modules.get(name)
        if mod is None:
            continue
        for attr, obj in list(vars(mod).items()):
            if isinstance(obj, _PLAIN) or type(obj).__name__ == "module":
                continue
            take(f"{name}.{attr}", obj)
            if isinstance(obj, type) and getattr(obj, "__module__", "") == name:
                for member, value in list(vars(obj).items()):
                    if not isinstance(value, _PLAIN):
                        take(f"{name}.{attr}.{member}", value)
    for name, attrs in _WATCHED_ATTRS.items():
        mod = sys.modules[name]
        for attr in attrs:
            if hasattr(mod, attr):
                take(f"{name}.{attr}", getattr(mod, attr))
    return snap


class _Stream:
    """Numbered JSON lines to the grader's pipe (bound functions only: nothing to monkeypatch)."""

    def __init__(self, fd: int, nonce: str) -> None:
        self.fd, self.nonce, self.seq = fd, nonce, 0

    def emit(self, kind: str, **data: object) -> None:
        if self.fd < 0:
            return
        line = _dumps({"seq": self.seq, "nonce": self.nonce, "t": kind, **data}).encode() + b"\n"
        self.seq += 1
        while line:
            line = line[_os_write(self.fd, line) :]


class _State:
    def __init__(self) -> None:
        config = _take_config()
        self.stream = _Stream(_take_fd(_RESULT_FD_ENV), str(config.get("nonce", "")))
        self.perturb = bool(config.get("perturb"))
        if self.perturb:
            _hide_current_test()
        # Taken on import: `-p` loads this module before any conftest or code under test runs.
        self.snapshot, self.deep = _snapshot(), _snapshot(deep=True)
        # the runner's content as this run found it, ids left out: the grader compares it with the gold
        # run's, so a swap made before this plugin loaded (the runner is the code under test) is seen too
        self.runner = {
            k: _sha256(v.partition(":")[2].encode()).hexdigest()[:16] for k, v in self.deep.items()
        }
        self.tampered: set[str] = set()
        self.untrusted_xfail: set[str] = set()

    def check(self, deep: bool = False) -> None:
        """Identities (code objects, defaults, closures included) after every test; ``deep``: content
        too (at collection's end and the session's: an edit of a code object's bytes keeps its identity)."""
        now = _snapshot()
        found = {key for key, seen in self.snapshot.items() if now.get(key) != seen}
        if deep:
            now = _snapshot(deep=True)
            found |= {key for key, seen in self.deep.items() if now.get(key) != seen}
        if sys.gettrace() is not None or sys.getprofile() is not None:
            found.add("sys.settrace/setprofile")
        if found - self.tampered:
            self.stream.emit("tampered", keys=sorted(found - self.tampered))
            self.tampered |= found


def _hide_current_test() -> None:
    """A perturbed run shows no PYTEST_CURRENT_TEST (pytest sets it around every phase)."""
    import _pytest.runner

    if hasattr(_pytest.runner, "_update_current_test_var"):
        _pytest.runner._update_current_test_var = lambda item, when: None


def _plugin_origin(plugin: object) -> str:
    mod = plugin if type(plugin).__name__ == "module" else sys.modules.get(type(plugin).__module__)
    return str(getattr(mod, "__file__", "") or getattr(mod, "__name__", "") or type(plugin).__qualname__)


def pytest_plugin_registered(plugin: object, manager: object) -> None:
    """Every plugin, including those registered before this module (pluggy replays them)."""
    _STATE.stream.emit("plugin", origin=_plugin_origin(plugin))


def pytest_configure(config: pytest.Config) -> None:
    if _STATE.perturb:  # read by pytest before this hook; a perturbed run does not show it to the tests
        os.environ.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    _STATE.stream.emit("collected", ids=[item.nodeid for item in session.items])
    _STATE.check(deep=True)


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
    _STATE.stream.emit(
        "phase",
        id=report.nodeid,
        when=report.when,
        outcome=report.outcome,
        xfail=hasattr(report, "wasxfail"),
        untrusted=report.nodeid in _STATE.untrusted_xfail,
    )
    if report.when == "teardown":
        _STATE.check()


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _STATE.stream.emit("collect-error", id=report.nodeid)


def _foreign_test_modules(session: pytest.Session) -> list[str]:
    """Test modules not loaded from their own file by pytest's rewriter or the standard loader."""
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


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _STATE.check(deep=True)
    foreign = _foreign_test_modules(session)
    if foreign:
        _STATE.stream.emit("tampered", keys=foreign)
    _STATE.stream.emit(
        "end",
        exitstatus=int(exitstatus),
        testscollected=int(session.testscollected),
        testsfailed=int(session.testsfailed),
        runner=_STATE.runner,
    )


# Last, so the snapshot holds this module's own hooks too.
_STATE = _State()

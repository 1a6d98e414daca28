"""`strict` grading: the tests run the grader's way and the result comes from a result stream.

- No current directory on ``sys.path`` (``python -P``), plugin autoload off
  (``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``) with the task env's installed plugins named with ``-p``,
  the grader's own ini (written from the base tree's pytest configuration) and ``--rootdir``,
  no cache plugin, the whole tree mounted read-only.
- The grader's plugin (`report_plugin`) writes every report phase as a numbered line into a pipe
  whose read end the grader holds outside the sandbox (no file the tests could rewrite); its
  configuration (nonce) comes through a second pipe, closed before any test code runs.
- Canaries only the grader knows (`canaries`: mutants of the F2P tests, written into the grader's
  copy of their files, each of which must fail where its original passes) run with the tests; a run
  whose canaries come out wrong, whose stream is out of sequence or holds a result for an id it
  never collected, is not believed. The stream is cross-checked against the process's
  real exit code and the runner's own summary line. Output is never parsed for markers.
- ``run_perturbed``: the F2P tests again, renamed, in a tree at another path, under another host
  name and argv, without ``-P``, with no ``PYTEST_*`` variable visible, real stdio (no capture) and
  no fault handler installed (the grader compares).
"""

from __future__ import annotations

import configparser
import json
import os
import re
import secrets
import shlex
import shutil
import string
import tempfile
import threading
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from polar_env.rewards import swebench_compat as sb
from polar_env.rewards.canaries import CanaryPlan, plan_canaries
from polar_env.rewards.sandbox_exec import TREE_MOUNT, VENV_MOUNT, SandboxRun, run_sandboxed
from polar_env.sandbox import beneath
from polar_env.sandbox.bwrap_argv import Mount
from polar_env.tasks.models import Task

GRADER_MOUNT = "/opt/polar-grader"
PLUGIN_MODULE = "polar_grader_report"
PLUGIN_SRC = Path(__file__).with_name("report_plugin.py")
MAX_REPORT_BYTES = 16 << 20  # of the result stream
PASSING = ("PASSED", "XFAIL")
# pytest's own order of config files per directory, with the section each must hold to count.
CONFIG_FILES = (
    ("pytest.ini", "pytest"),
    (".pytest.ini", "pytest"),
    ("pyproject.toml", None),
    ("tox.ini", "pytest"),
    ("setup.cfg", "tool:pytest"),
)
SUMMARY_RE = re.compile(r"^=+ (?P<body>(?:\d+ \w+(?:, )?)+)(?: in [\d.]+s.*)? =+$", re.M)
COUNT_RE = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")
RUNNER_DIRS = ("/_pytest/", "/pytest/", "/pluggy/")
# the perturbed run leaves the process's stdio real (no capture: ``sys.stdin.fileno()`` works, as in use)
PERTURBED_STDIO = ("--capture=no",)


class StrictUnsupported(Exception):
    """The task's test command is not pytest: strict has no structured report for it."""


def pytest_args(task: Task) -> list[str]:
    """The task's own pytest options (``python -m pytest -rA ...`` -> ``[-rA, ...]``); a shell line of
    several commands (SWE-rebench V2's ``a && b``) is not one pytest run."""
    lexer = shlex.shlex(task.test_cmd, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    if any(not set(word) - set("();<>|&") for word in lexer):
        raise StrictUnsupported(f"test command {task.test_cmd!r} is more than one command")
    argv = shlex.split(task.test_cmd)
    if argv[:3] == ["python", "-m", "pytest"]:
        return argv[3:]
    if argv[:1] in (["pytest"], ["py.test"]):
        return argv[1:]
    raise StrictUnsupported(f"test command {task.test_cmd!r} is not pytest")


def _ini_value(value: object) -> str:
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def config_dirs(directives: list[str]) -> list[PurePosixPath]:
    """The directories pytest looks in for its config file, nearest first."""
    dirs = [
        PurePosixPath(d).parent if d.endswith(".py") or "::" in d else PurePosixPath(d)
        for d in (x.split("::")[0] for x in directives)
    ] or [PurePosixPath(".")]
    common = PurePosixPath(os.path.commonpath([str(d) for d in dirs])) if dirs else PurePosixPath(".")
    return [common, *common.parents]


def base_pytest_options(tree: Path, directives: list[str]) -> dict[str, str]:
    """The options of the config file pytest would pick from the (reset) tree, as pytest finds it."""
    for here in config_dirs(directives):
        for name, section in CONFIG_FILES:
            path = tree / here / name
            if not path.is_file() or path.is_symlink():
                continue
            if section is None:  # pyproject.toml: its [tool.pytest.ini_options] table
                options = tomllib.loads(path.read_text()).get("tool", {}).get("pytest", {}).get("ini_options")
                if options is not None:
                    return {k: _ini_value(v) for k, v in options.items()}
                continue
            parser = configparser.RawConfigParser(strict=False)
            parser.read_string(path.read_text())
            if parser.has_section(section):
                return dict(parser.items(section))
            if name == "pytest.ini":
                return {}
    return {}


def render_ini(options: dict[str, str]) -> str:
    lines = ["[pytest]"]
    for key, value in options.items():
        first, *rest = value.split("\n")
        lines.append(f"{key} = {first}")
        lines.extend(f"    {line}" for line in rest if line.strip())
    return "\n".join(lines) + "\n"


def venv_plugins(venv: Path) -> list[str]:
    """Modules of the pytest plugins the task's pinned env installs (its declared plugins)."""
    modules: list[str] = []
    for ep_file in sorted(venv.glob("lib/python*/site-packages/*.dist-info/entry_points.txt")):
        parser = configparser.RawConfigParser()
        parser.read_string(ep_file.read_text())
        if parser.has_section("pytest11"):
            modules += [v.split(":")[0].strip() for _, v in parser.items("pytest11")]
    return sorted(set(modules))


@dataclass
class StrictOutcome:
    """What the strict run established: per-test statuses, or why the run cannot be believed."""

    status_map: dict[str, str] = field(default_factory=dict)
    statuses: dict[str, str] = field(default_factory=dict)  # node id -> status (canaries left out)
    collected: list[str] = field(default_factory=list)  # node ids, canaries left out
    valid: bool = False
    violations: list[str] = field(default_factory=list)  # integrity/consistency findings
    untrusted_xfail: list[str] = field(default_factory=list)  # xfails raised by code under test
    error: str = ""
    runner: dict[str, str] = field(
        default_factory=dict
    )  # the report pipeline's content as its plugin found it


def _random_name(prefix: str = "") -> str:
    return prefix + "".join(secrets.choice(string.ascii_lowercase) for _ in range(10))


def _drain(fd: int, sink: dict[str, Any]) -> None:
    """Read the result pipe to its end, keeping at most MAX_REPORT_BYTES."""
    chunks, size = [], 0
    with os.fdopen(fd, "rb", buffering=0) as f:
        while chunk := f.read(65536):
            size += len(chunk)
            if size <= MAX_REPORT_BYTES:
                chunks.append(chunk)
    sink["data"], sink["size"] = b"".join(chunks), size


def _feed(fd: int, data: bytes) -> None:
    """Write ``data`` to the config pipe and close it; a reader that went away ends it early."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError:  # BrokenPipeError: the run ended (or never started) without reading its config
        pass
    finally:
        os.close(fd)


def _run_with_stream(
    argv: list[str],
    *,
    tree: Path,
    venv: Path,
    env: dict[str, str],
    timeout_s: float,
    grader_dir: Path,
    grader_mount: str,
    config: dict,
    tree_mount: str = TREE_MOUNT,
    hostname: str = "sandbox",
) -> tuple[SandboxRun, bytes, int]:
    """Run ``argv`` with the config pipe (filled, closed) and the result pipe (drained here)."""
    cfg_r, cfg_w = os.pipe()
    # Written by a thread while the plugin reads: a config past the pipe's buffer (many canaries) would
    # block a write made before any reader exists. A run that never reads it ends the write (EPIPE).
    writer = threading.Thread(target=_feed, args=(cfg_w, json.dumps(config).encode()), daemon=True)
    writer.start()
    res_r, res_w = os.pipe()
    sink: dict[str, Any] = {}
    reader = threading.Thread(target=_drain, args=(res_r, sink), daemon=True)
    reader.start()
    run_env = {**env, "POLAR_GRADER_CONFIG_FD": str(cfg_r), "POLAR_GRADER_RESULT_FD": str(res_w)}
    try:
        run = run_sandboxed(
            argv,
            tree=tree,
            venv=venv,
            timeout_s=timeout_s,
            env=run_env,
            tree_writable=False,
            extra_mounts=[Mount(grader_mount, grader_dir)],
            pass_fds=[cfg_r, res_w],
            tree_mount=tree_mount,
            hostname=hostname,
        )
    finally:
        os.close(cfg_r)
        os.close(res_w)
        reader.join()
        writer.join()
    return run, sink.get("data", b""), int(sink.get("size", 0))


def _grader_dir(tmp: Path, task: Task, tree: Path, module: str, **ini: str) -> Path:
    grader_dir = tmp / "grader"
    grader_dir.mkdir()
    (grader_dir / f"{module}.py").write_text(PLUGIN_SRC.read_text())
    (grader_dir / "pytest.ini").write_text(
        render_ini({**base_pytest_options(tree, task.test_directives), **ini})
    )
    return grader_dir


def _pytest_options(task: Task, venv: Path, grader_mount: str, tree_mount: str, module: str) -> list[str]:
    plugins = [p for m in venv_plugins(venv) for p in ("-p", m)]
    return [
        "-c",
        f"{grader_mount}/pytest.ini",
        f"--rootdir={tree_mount}",
        f"--confcutdir={tree_mount}",
        "-p",
        "no:cacheprovider",
        "-p",
        module,
        *plugins,
        *pytest_args(task),
    ]


def test_file_of(test_id: str) -> str:
    return test_id.split("::")[0]


def run_strict(
    task: Task, tree: Path, venv: Path, env: dict[str, str], timeout_s: float
) -> tuple[SandboxRun, StrictOutcome]:
    """Run the task's tests the strict way on the (already reset and test-patched) ``tree``."""
    with tempfile.TemporaryDirectory(prefix="polar-strict-") as tmp:
        grader_dir = _grader_dir(Path(tmp), task, tree, PLUGIN_MODULE)
        config = {"nonce": secrets.token_hex(16)}
        pythonpath = ":".join(filter(None, [GRADER_MOUNT, env.get("PYTHONPATH", "")]))
        run_env = {
            **env,
            "PYTHONPATH": pythonpath,
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTHONNOUSERSITE": "1",
        }
        originals = f2p_sources(task.FAIL_TO_PASS, lambda rel: beneath.read(tree, rel))
        canaries = plan_canaries(originals, task.FAIL_TO_PASS)
        argv = [
            "python",
            "-P",
            "-m",
            "pytest",
            *_pytest_options(task, venv, GRADER_MOUNT, TREE_MOUNT, PLUGIN_MODULE),
            *written_directives(canaries, task.test_directives),
        ]
        try:
            for rel, text in canaries.files.items():
                beneath.write(tree, rel, text.encode(), mode="100644")
            run, data, size = _run_with_stream(
                argv,
                tree=tree,
                venv=venv,
                env=run_env,
                timeout_s=timeout_s,
                grader_dir=grader_dir,
                grader_mount=GRADER_MOUNT,
                config=config,
            )
        finally:
            for rel in canaries.files:
                beneath.write(tree, rel, originals[rel].encode(), mode="100644")
    return run, judge_stream(data, size, config, run, task.repo, canaries=canaries)


def f2p_sources(f2p: list[str], read: Callable[[str], bytes | None]) -> dict[str, str]:
    """The text of each F2P test file that is a plain file (``read``: its bytes, None where it is not)."""
    out = {}
    for rel in dict.fromkeys(test_file_of(t) for t in f2p if "::" in t):
        try:
            data = read(rel)
            if data is not None:
                out[rel] = data.decode()
        except (OSError, ValueError):  # a link, a directory, undecodable: no canaries in it
            continue
    return out


def written_directives(canaries: CanaryPlan, directives: list[str]) -> list[str]:
    """The task's directives as they name the planned files' tests (every test there is renamed), then the
    canaries in files those would not collect (the directives name single tests)."""
    paths = [d.rstrip("/") for d in directives if "::" not in d]

    def covered(rel: str) -> bool:
        return any(d in ("", ".") or rel == d or rel.startswith(d + "/") for d in paths)

    return [
        *dict.fromkeys(canaries.written(d) for d in directives if d),  # "": the test command names them
        *[c for c in canaries.expect if not covered(c.split("::")[0])],
    ]


@dataclass
class Perturbed:
    """The perturbed run of the F2P tests: its outcome and graded id -> renamed id."""

    outcome: StrictOutcome
    renamed: dict[str, str]
    run: SandboxRun | None = None


def _rename_f2p(tree: Path, f2p: list[str], prefix: str) -> dict[str, str]:
    """Rename each F2P test file and test function in ``tree`` (a grader-owned copy); graded id -> new id.

    Functions get ``prefix`` (the perturbed run's ``python_functions``), so no F2P test is named test*."""
    files: dict[str, str] = {}
    funcs: dict[tuple[str, str], str] = {}
    renamed: dict[str, str] = {}
    for test_id in f2p:
        if "::" not in test_id:
            continue
        rel, rest = test_id.split("::", 1)
        path = tree / rel
        if any(p.is_symlink() for p in [path, *path.parents] if p.is_relative_to(tree)) or not path.is_file():
            raise ValueError(f"{rel} is not a plain file in the graded tree")
        new_rel = files.setdefault(rel, str(Path(rel).with_name(_random_name("test_") + ".py")))
        *scopes, last = rest.split("::")
        func, bracket, params = last.partition("[")
        new_func = funcs.setdefault((rel, func), _random_name(prefix))
        renamed[test_id] = "::".join([new_rel, *scopes, new_func + bracket + params])
    for rel, new_rel in files.items():
        source = (tree / rel).read_text()
        for (frel, func), new_func in funcs.items():
            if frel == rel:
                source = re.sub(rf"(\bdef\s+){re.escape(func)}(\s*\()", rf"\g<1>{new_func}\g<2>", source)
        (tree / rel).unlink()
        (tree / new_rel).write_text(source)
    return renamed


@dataclass
class PerturbedPlan:
    """Everything random about one perturbed run (names, paths), and the grader files it needs."""

    renamed: dict[str, str]  # graded F2P id -> its id in the perturbed run
    files: dict[str, str]  # renamed test file: graded path -> perturbed path
    mount: str
    grader_mount: str
    config: dict
    canaries: CanaryPlan = field(default_factory=CanaryPlan)


def plan_perturbed(
    task: Task,
    copy: Path,
    config_tree: Path,
    grader_dir: Path,
    *,
    venv: Path | None = None,
    plugins: list[str] | None = None,
) -> PerturbedPlan:
    """Rename the F2P test files and functions in ``copy`` and write the perturbed run's grader files
    (plugin under a random module name, ini with ``python_functions`` the random prefix, a runner script
    that shows a random ``argv[0]``) into ``grader_dir``. Raises ValueError for a test file that is a link."""
    unittest = any("TestCase" in (copy / test_file_of(t)).read_text() for t in task.FAIL_TO_PASS if "::" in t)
    prefix = "test_" if unittest else _random_name()[:6] + "_"  # unittest collects test* only
    before = {test_file_of(t) for t in task.FAIL_TO_PASS if "::" in t}
    renamed = _rename_f2p(copy, task.FAIL_TO_PASS, prefix)
    files = {
        test_file_of(old): test_file_of(new) for old, new in renamed.items() if test_file_of(old) in before
    }
    new_files = sorted({test_file_of(t) for t in renamed.values()})
    canaries = plan_canaries(
        {rel: (copy / rel).read_text() for rel in new_files}, list(renamed.values()), prefix=prefix, extra=0
    )  # (their ids map back to ``renamed``'s values)
    for rel, text in canaries.files.items():
        (copy / rel).write_text(text)
    module, mount, grader_mount = _random_name(), "/srv/" + _random_name(), "/opt/" + _random_name()
    grader_dir.mkdir(parents=True, exist_ok=True)
    (grader_dir / f"{module}.py").write_text(PLUGIN_SRC.read_text())
    options = {**base_pytest_options(config_tree, task.test_directives), "python_functions": prefix}
    (grader_dir / "pytest.ini").write_text(render_ini(options))
    if plugins is None:
        if venv is None:
            raise ValueError("plan_perturbed needs the task's venv or its plugin modules")
        plugins = venv_plugins(venv)
    plugin_args = [p for m in plugins for p in ("-p", m)]
    argv = [
        "-c",
        f"{grader_mount}/pytest.ini",
        f"--rootdir={mount}",
        f"--confcutdir={mount}",
        "-p",
        "no:cacheprovider",
        "-p",
        module,
        "-p",
        "no:faulthandler",
        *plugin_args,
        # a test command naming test files (SWE-rebench V2's) names them as they were: the renamed ones follow
        *[a for a in pytest_args(task) if a.split("::")[0] not in files],
        *PERTURBED_STDIO,
        *written_directives(canaries, list(renamed.values())),
    ]
    (grader_dir / "main.py").write_text(
        f"import sys\nimport pytest\nsys.argv[:] = [{'/usr/local/bin/' + _random_name()!r}]\n"
        f"raise SystemExit(pytest.main({argv!r}))\n"
    )
    config = {"nonce": secrets.token_hex(16), "perturb": True}
    return PerturbedPlan(renamed, files, mount, grader_mount, config, canaries)


def run_perturbed(task: Task, tree: Path, venv: Path, env: dict[str, str], timeout_s: float) -> Perturbed:
    """The F2P tests once more, where nothing says "graded test run": renamed modules and functions, the
    tree at another path, another hostname and argv[0], no ``-P``, no ``PYTEST_*`` variable visible."""
    with tempfile.TemporaryDirectory(prefix="polar-perturbed-") as tmp:
        copy = Path(tmp) / "tree"
        shutil.copytree(tree, copy, symlinks=True)
        try:
            plan = plan_perturbed(task, copy, tree, Path(tmp) / "grader", venv=venv)
        except (ValueError, OSError, UnicodeDecodeError) as e:
            return Perturbed(StrictOutcome(violations=[f"perturbed-run: {e}"]), {})
        run_env = {k: v.replace(TREE_MOUNT, plan.mount) for k, v in env.items()}
        run_env.update({"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONNOUSERSITE": "1"})
        run, data, size = _run_with_stream(
            ["python", f"{plan.grader_mount}/main.py"],
            tree=copy,
            venv=venv,
            env=run_env,
            timeout_s=timeout_s,
            grader_dir=Path(tmp) / "grader",
            grader_mount=plan.grader_mount,
            config=plan.config,
            tree_mount=plan.mount,
            hostname=_random_name(),
        )
    return Perturbed(
        judge_stream(data, size, plan.config, run, task.repo, tree_mount=plan.mount, canaries=plan.canaries),
        plan.renamed,
        run,
    )


def perturbed_disagreement(perturbed: Perturbed) -> list[str]:
    """Each F2P test must pass in the perturbed run too (the graded run already passed it)."""
    out = perturbed.outcome
    if perturbed.run is not None and perturbed.run.timed_out:
        return ["perturbed-run: timed out"]
    if not out.valid:
        return [f"perturbed-run: {(out.error or '; '.join(out.violations))[:300]}"]
    differ = {
        t: out.statuses.get(new, "MISSING")
        for t, new in perturbed.renamed.items()
        if out.statuses.get(new) != "PASSED"
    }
    return [f"perturbed-run: F2P tests that pass only when graded: {differ}"] if differ else []


def _status(phases: list[dict]) -> str:
    """One test's status from its report phases (SWE-bench's names; a failing phase wins)."""
    status = ""
    for p in phases:
        outcome, when = p.get("outcome"), p.get("when")
        if outcome == "failed":
            return "FAILED" if when == "call" else "ERROR"
        if outcome == "skipped" and p.get("xfail") and p.get("untrusted"):
            return "FAILED"
        if outcome == "skipped":
            status = "XFAIL" if p.get("xfail") else "SKIPPED"
        elif when == "call":
            status = "XPASS" if p.get("xfail") else "PASSED"
    return status


def judge_stream(
    data: bytes,
    size: int,
    config: dict,
    run: SandboxRun,
    repo: str,
    tree_mount: str = TREE_MOUNT,
    canaries: CanaryPlan | None = None,
) -> StrictOutcome:
    """Believe the stream only if it is the run's own, complete, in sequence and agrees with the runner.

    Total: the stream is written by (or next to) tested code, so whatever it holds (a line nested past
    the parser's depth, a field of the wrong type) is a ``stream-forged`` violation, never an exception."""
    try:
        return _judge_stream(data, size, config, run, repo, tree_mount, canaries or CanaryPlan())
    except Exception as e:  # noqa: BLE001 - any value the tested code can forge
        return StrictOutcome(
            violations=[
                f"stream-forged: the stream does not read as the plugin's "
                f"({type(e).__name__}: {str(e)[:200]})"
            ]
        )


def _judge_stream(
    data: bytes, size: int, config: dict, run: SandboxRun, repo: str, tree_mount: str, canaries: CanaryPlan
) -> StrictOutcome:
    out = StrictOutcome()
    if size > MAX_REPORT_BYTES:
        out.error = f"result stream larger than {MAX_REPORT_BYTES} bytes"
        return out
    events: list[dict] = []
    for i, line in enumerate(data.splitlines()):
        try:
            event = json.loads(line)
        except Exception:  # noqa: BLE001 - ValueError, RecursionError (a line nested too deep), ...
            out.violations.append(f"stream-forged: line {i} is not the plugin's")
            break
        if (
            not isinstance(event, dict)
            or event.get("seq") != i
            or not secrets.compare_digest(str(event.get("nonce", "")), config["nonce"])
        ):
            out.violations.append(f"stream-forged: line {i} is out of sequence or lacks the run's nonce")
            break
        events.append(event)
    kinds: dict[str, list[dict]] = {}
    for event in events:
        kinds.setdefault(str(event.get("t")), []).append(event)
    ends, collected_events = kinds.get("end", []), kinds.get("collected", [])
    if len(ends) != 1 or len(collected_events) != 1:
        out.violations += [] if out.violations else ["stream-forged: not one collection and one end"]
        if not ends:
            out.error = "the runner did not finish its session"
        return out
    collected = [str(i) for i in collected_events[0].get("ids", [])]
    out.runner = {str(k): str(v) for k, v in dict(ends[0].get("runner") or {}).items()}
    phases: dict[str, list[dict]] = {}
    for p in kinds.get("phase", []):
        phases.setdefault(str(p.get("id")), []).append(p)
    all_statuses = {nodeid: _status(ps) for nodeid, ps in phases.items()}
    for nodeid, ps in phases.items():
        whens = [str(p.get("when")) for p in ps]
        if whens not in (["setup"], ["setup", "teardown"], ["setup", "call"], ["setup", "call", "teardown"]):
            out.violations.append(f"stream-forged: {nodeid} reported phases {whens}")
            break
    ghosts = sorted(set(phases) - set(collected))
    if ghosts:
        out.violations.append(f"ghost-id: results for ids never collected: {ghosts[:3]}")
    out.violations += canaries.violations(all_statuses, collected)
    out.statuses = {
        canaries.task_id(k): v for k, v in all_statuses.items() if not canaries.source_of(k)[0] and v
    }
    out.collected = [canaries.task_id(c) for c in collected if not canaries.source_of(c)[0]]
    out.status_map = sb.status_map_from_outcomes(out.statuses, repo=repo)
    out.violations += [f"runner-tampered: {k}" for e in kinds.get("tampered", []) for k in e.get("keys", [])]
    out.violations += [
        f"plugin-registered: {o}"
        for e in kinds.get("plugin", [])
        if not _trusted_plugin(o := str(e.get("origin")), tree_mount)
    ]
    out.untrusted_xfail = sorted(
        {canaries.task_id(str(p.get("id"))) for p in kinds.get("phase", []) if p.get("untrusted")}
    )
    end = ends[0]
    exitstatus, failed = int(end.get("exitstatus", -1)), int(end.get("testsfailed", -1))
    if exitstatus != run.returncode:
        out.violations.append(f"exit-mismatch: runner said {exitstatus}, process exited {run.returncode}")
    bad = sum(s in ("FAILED", "ERROR") for s in all_statuses.values()) - len(out.untrusted_xfail)
    failed_reports = sum(p.get("outcome") == "failed" for p in kinds.get("phase", [])) + len(
        kinds.get("collect-error", [])
    )
    if (exitstatus == 0) != (bad == 0 and failed == 0) or failed != failed_reports:
        out.violations.append(
            f"count-mismatch: exit {exitstatus}, {failed} failed by the runner, {bad} failing tests reported"
        )
    summary = _summary_counts(run.output)
    if summary is not None:
        mine = {s: sum(v == s for v in all_statuses.values()) for s in ("PASSED", "FAILED", "ERROR")}
        # A test whose call passed but whose teardown errored is counted both ways by the runner.
        if summary.get("failed", 0) != mine["FAILED"] - len(out.untrusted_xfail) or not (
            mine["PASSED"] <= summary.get("passed", 0) <= mine["PASSED"] + mine["ERROR"]
        ):
            out.violations.append(f"summary-mismatch: runner printed {summary}, report has {mine}")
    if exitstatus not in (0, 1):
        out.error = f"pytest exit status {exitstatus} (interrupted, internal error, usage error or no tests)"
    out.valid = not out.error and not out.violations
    return out


def _trusted_plugin(origin: str, tree_mount: str = TREE_MOUNT) -> bool:
    """Plugins from the venv, the standard library, the grader, conftests or the runner's packages."""
    if not origin.startswith(tree_mount + "/"):
        return origin.startswith(("/usr/", VENV_MOUNT + "/", "/opt/")) or not origin.startswith("/")
    return origin.endswith("/conftest.py") or any(d in origin for d in RUNNER_DIRS)


def _summary_counts(output: str) -> dict[str, int] | None:
    """The runner's own final ``== N passed, M failed in Xs ==`` line (the last one printed)."""
    matches = SUMMARY_RE.findall(output)
    if not matches:
        return None
    counts: dict[str, int] = {}
    for n, word in COUNT_RE.findall(matches[-1]):
        counts["error" if word.startswith("error") else word] = int(n)
    return counts

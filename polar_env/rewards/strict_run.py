"""`strict` grading: the tests run the grader's way and the result comes from a structured report.

- No current directory on ``sys.path`` (``python -P``), plugin autoload off
  (``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``) with the task env's installed plugins named with ``-p``,
  the grader's own ini (written from the base tree's pytest configuration) and ``--rootdir``,
  no cache plugin, the whole tree mounted read-only.
- The grader's plugin (`report_plugin`) writes per-test outcomes, the runner's counts and exit
  status, and what it saw tampered with, to a directory outside the tree; the run's nonce comes
  through a pipe.
- The report is cross-checked against the process's real exit code and the runner's own summary
  line before any outcome is believed. Output is never parsed for markers.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import secrets
import shlex
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from polar_env.rewards import swebench_compat as sb
from polar_env.rewards.sandbox_exec import SANDBOX_UID, TREE_MOUNT, VENV_MOUNT, SandboxRun, run_sandboxed
from polar_env.sandbox.bwrap_argv import Mount
from polar_env.tasks.models import Task

GRADER_MOUNT = "/opt/polar-grader"
REPORT_MOUNT = "/run/polar-report"
PLUGIN_MODULE = "polar_grader_report"
PLUGIN_SRC = Path(__file__).with_name("report_plugin.py")
MAX_REPORT_BYTES = 16 << 20
# pytest's own order of config files per directory, with the section each must hold to count.
CONFIG_FILES = (("pytest.ini", "pytest"), (".pytest.ini", "pytest"), ("pyproject.toml", None),
                ("tox.ini", "pytest"), ("setup.cfg", "tool:pytest"))
SUMMARY_RE = re.compile(r"^=+ (?P<body>(?:\d+ \w+(?:, )?)+)(?: in [\d.]+s.*)? =+$", re.M)
COUNT_RE = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")
RUNNER_DIRS = ("/_pytest/", "/pytest/", "/pluggy/")


class StrictUnsupported(Exception):
    """The task's test command is not pytest: strict has no structured report for it."""


def pytest_args(task: Task) -> list[str]:
    """The task's own pytest options (``python -m pytest -rA ...`` -> ``[-rA, ...]``)."""
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


def base_pytest_options(tree: Path, directives: list[str]) -> dict[str, str]:
    """The options of the config file pytest would pick from the (reset) tree, as pytest finds it."""
    dirs = [PurePosixPath(d).parent if d.endswith(".py") or "::" in d else PurePosixPath(d)
            for d in (x.split("::")[0] for x in directives)] or [PurePosixPath(".")]
    common = PurePosixPath(os.path.commonpath([str(d) for d in dirs])) if dirs else PurePosixPath(".")
    for here in [common, *common.parents]:
        for name, section in CONFIG_FILES:
            path = tree / here / name
            if not path.is_file() or path.is_symlink():
                continue
            if name == "pyproject.toml":
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
    valid: bool = False
    violations: list[str] = field(default_factory=list)  # integrity/consistency findings
    untrusted_xfail: list[str] = field(default_factory=list)  # xfails raised by code under test
    error: str = ""


def run_strict(task: Task, tree: Path, venv: Path, env: dict[str, str], timeout_s: float) -> tuple[SandboxRun, StrictOutcome]:
    """Run the task's tests the strict way on the (already reset and test-patched) ``tree``."""
    with tempfile.TemporaryDirectory(prefix="polar-strict-") as tmp:
        grader_dir, report_dir = Path(tmp) / "grader", Path(tmp) / "report"
        grader_dir.mkdir()
        report_dir.mkdir()
        (grader_dir / f"{PLUGIN_MODULE}.py").write_text(PLUGIN_SRC.read_text())
        (grader_dir / "pytest.ini").write_text(render_ini(base_pytest_options(tree, task.test_directives)))
        if os.geteuid() == 0:
            os.chown(report_dir, SANDBOX_UID, SANDBOX_UID)
        plugins = [p for m in venv_plugins(venv) for p in ("-p", m)]
        argv = ["python", "-P", "-m", "pytest", "-c", f"{GRADER_MOUNT}/pytest.ini", f"--rootdir={TREE_MOUNT}",
                f"--confcutdir={TREE_MOUNT}", "-p", "no:cacheprovider", "-p", PLUGIN_MODULE, *plugins,
                *pytest_args(task), *task.test_directives]
        nonce = secrets.token_hex(16)
        read_fd, write_fd = os.pipe()
        os.write(write_fd, nonce.encode())
        os.close(write_fd)
        pythonpath = ":".join(filter(None, [GRADER_MOUNT, env.get("PYTHONPATH", "")]))
        run_env = {**env, "PYTHONPATH": pythonpath, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                   "PYTHONNOUSERSITE": "1", "POLAR_GRADER_NONCE_FD": str(read_fd),
                   "POLAR_GRADER_REPORT": f"{REPORT_MOUNT}/report.json"}
        try:
            run = run_sandboxed(argv, tree=tree, venv=venv, timeout_s=timeout_s, env=run_env, tree_writable=False,
                                extra_mounts=[Mount(GRADER_MOUNT, grader_dir), Mount(REPORT_MOUNT, report_dir, "bind")],
                                pass_fds=[read_fd])
        finally:
            os.close(read_fd)
        report_path = report_dir / "report.json"
        outcome = (check_report(report_path, nonce, run, task.repo) if report_path.is_file() and not report_path.is_symlink()
                   else StrictOutcome(error="the runner wrote no report (it did not finish its session)"))
    return run, outcome


def check_report(path: Path, nonce: str, run: SandboxRun, repo: str) -> StrictOutcome:
    """Believe the plugin's report only if it is the run's own and agrees with the runner."""
    if path.stat().st_size > MAX_REPORT_BYTES:
        return StrictOutcome(error=f"report larger than {MAX_REPORT_BYTES} bytes")
    try:
        report = json.loads(path.read_text())
        statuses = {str(k): str(v) for k, v in report["statuses"].items()}
        exitstatus, failed = int(report["exitstatus"]), int(report["testsfailed"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return StrictOutcome(error=f"malformed report: {e}")
    out = StrictOutcome(status_map=sb.status_map_from_outcomes(statuses, repo=repo))
    if not secrets.compare_digest(str(report.get("nonce", "")), nonce):
        out.violations.append("report-forged: the report does not carry this run's nonce")
    out.violations += [f"runner-tampered: {k}" for k in report.get("tampered", [])]
    out.violations += [f"plugin-registered: {o}" for o in report.get("plugins", []) if not _trusted_plugin(o)]
    if exitstatus != run.returncode:
        out.violations.append(f"exit-mismatch: runner said {exitstatus}, process exited {run.returncode}")
    out.untrusted_xfail = [str(t) for t in report.get("untrusted_xfail", [])]
    bad = sum(s in ("FAILED", "ERROR") for s in statuses.values()) - len(out.untrusted_xfail)
    if (exitstatus == 0) != (bad == 0 and failed == 0) or failed != int(report.get("failed_reports", failed)):
        out.violations.append(f"count-mismatch: exit {exitstatus}, {failed} failed by the runner, "
                              f"{bad} failing tests reported")
    summary = _summary_counts(run.output)
    if summary is not None:
        mine = {s: sum(v == s for v in statuses.values()) for s in ("PASSED", "FAILED", "ERROR")}
        # A test whose call passed but whose teardown errored is counted both ways by the runner.
        if summary.get("failed", 0) != mine["FAILED"] - len(out.untrusted_xfail) or not (
                mine["PASSED"] <= summary.get("passed", 0) <= mine["PASSED"] + mine["ERROR"]):
            out.violations.append(f"summary-mismatch: runner printed {summary}, report has {mine}")
    if exitstatus not in (0, 1):
        out.error = f"pytest exit status {exitstatus} (interrupted, internal error, usage error or no tests)"
    out.valid = not out.error and not out.violations
    return out


def _trusted_plugin(origin: str) -> bool:
    """Plugins from the venv, the standard library, the grader, conftests or the runner's packages."""
    if not origin.startswith(TREE_MOUNT + "/"):
        return origin.startswith(("/usr/", VENV_MOUNT + "/", GRADER_MOUNT + "/")) or not origin.startswith("/")
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

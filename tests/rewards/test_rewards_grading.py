"""End-to-end grading of the bundled tasks in the bubblewrap sandbox (real venvs, real pytest).

Each bundled task must: resolve with its gold patch; not resolve with an empty patch, a
plausible wrong fix, or a fix that breaks a PASS_TO_PASS test; report a non-applying patch;
and refuse a vacuous FAIL_TO_PASS list.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from polar_env.rewards import swebench_compat as sb
from polar_env.rewards.grading import FailureKind, GradeResult, grade
from polar_env.rewards.patch import ApplyMethod, apply_patch, tree_patch
from polar_env.rewards.sandbox_exec import run_sandboxed
from polar_env.tasks.env import ensure_task_env
from polar_env.tasks.loader import load_tasks
from polar_env.tasks.models import Task, TaskEnvironment
from polar_env.tasks.tree import materialize

pytestmark = pytest.mark.needs("bwrap")

TASKS = {t.instance_id: t for t in load_tasks("bundled")}

# Per task: (file, old, new) edits on the base tree. "wrong" is a plausible fix that misses the
# issue; "breaks_p2p" is applied on top of the gold patch and breaks a PASS_TO_PASS test.
EDITS: dict[str, dict[str, list[tuple[str, str, str]]]] = {
    "pallets__flask-5014": {
        "wrong": [
            (
                "src/flask/blueprints.py",
                '        if "." in name:\n',
                "        if name is None:\n            raise ValueError(\"'name' may not be empty.\")\n\n"
                '        if "." in name:\n',
            )
        ],
        "breaks_p2p": [
            ("src/flask/blueprints.py", "        self.name = name\n", "        self.name = name.upper()\n")
        ],
    },
    "psf__requests-5414": {
        "wrong": [
            (
                "requests/models.py",
                "        elif host.startswith(u'*'):\n",
                "        elif host.startswith(u'*') or host.endswith(u'.'):\n",
            )
        ],
        "breaks_p2p": [
            ("requests/models.py", 'raise InvalidURL("Invalid URL %r: No host supplied" % url)', "pass")
        ],
    },
    "psf__requests-6028": {
        "wrong": [
            (
                "requests/utils.py",
                "    if scheme is None:\n        scheme = new_scheme\n",
                (
                    "    if auth:\n        netloc = auth + netloc\n    if scheme is None:\n"
                    "        scheme = new_scheme\n"
                ),
            )
        ],
        "breaks_p2p": [
            (
                "requests/utils.py",
                "        value = value.items()\n\n    return list(value)\n",
                "        value = value.items()\n\n    return list(value)[1:]\n",
            )
        ],
    },
    "pytest-dev__pytest-10051": {
        # Clearing in place in reset() also wipes the setup-phase records: plausible, wrong.
        "wrong": [
            ("src/_pytest/logging.py", "        self.records = []\n", "        self.records.clear()\n")
        ],
        "breaks_p2p": [
            (
                "src/_pytest/logging.py",
                "        return [r.getMessage() for r in self.records]\n",
                "        return [r.getMessage().upper() for r in self.records]\n",
            )
        ],
    },
    "marshmallow-code__marshmallow-1359": {
        "wrong": [
            (
                "src/marshmallow/fields.py",
                "            or getattr(schema.opts, self.SCHEMA_OPTS_VAR_NAME)\n",
                '            or getattr(getattr(schema, "opts", None), self.SCHEMA_OPTS_VAR_NAME, None)\n',
            )
        ],
        "breaks_p2p": [
            (
                "src/marshmallow/fields.py",
                "        self.name = self.name or field_name\n",
                "        self.name = (self.name or field_name).upper()\n",
            )
        ],
    },
}


def make_patch(task: Task, tmp: Path, edits: list[tuple[str, str, str]], *, on_gold: bool) -> str:
    """Edit a fresh base tree the way an agent would and extract its patch."""
    tree = materialize(task, tmp / "agent")
    if on_gold:
        assert apply_patch(tree, task.patch)[0] == ApplyMethod.git_apply
    for rel, old, new in edits:
        text = (tree / rel).read_text()
        assert text.count(old) == 1, (rel, old)
        (tree / rel).write_text(text.replace(old, new))
    return tree_patch(tree)


@pytest.fixture(scope="module", autouse=True)
def task_envs():
    for task in TASKS.values():
        ensure_task_env(task)


def test_every_bundled_task_has_negative_patches():
    assert set(EDITS) == set(TASKS)


def test_markers_match_installed_swebench():
    assert sb.markers_match_swebench()
    assert sb.parser_name("pallets/flask") in ("parse_log_flask", "parse_log_pytest")
    assert sb.parser_name("example/unknown") == "parse_log_pytest"


@pytest.mark.slow
@pytest.mark.parametrize("iid", sorted(TASKS))
def test_gold_patch_resolves(iid: str):
    task = TASKS[iid]
    r = grade(task, task.patch)
    assert r.resolved and r.reward == 1.0, r.log_tail
    assert r.failure_kind == FailureKind.none and r.apply_method == ApplyMethod.git_apply
    assert set(r.fail_to_pass.values()) == {"PASSED"}
    assert all(s in ("PASSED", "XFAIL", "SKIPPED") for s in r.pass_to_pass.values())
    assert r.timings["total_s"] < 60


@pytest.mark.parametrize("iid", sorted(TASKS))
def test_empty_patch_is_not_resolved(iid: str):
    for patch in ("", "  \n", None):
        r = grade(TASKS[iid], patch)
        assert not r.resolved and r.reward == 0.0 and r.failure_kind == FailureKind.empty_patch


@pytest.mark.slow
@pytest.mark.parametrize("iid", sorted(TASKS))
def test_plausible_wrong_patch_is_not_resolved(iid: str, tmp_path: Path):
    task = TASKS[iid]
    r = grade(task, make_patch(task, tmp_path, EDITS[iid]["wrong"], on_gold=False))
    assert r.patch_applied and r.failure_kind == FailureKind.none, r.log_tail
    assert not r.resolved and r.reward == 0.0
    assert any(s != "PASSED" for s in r.fail_to_pass.values())


@pytest.mark.slow
@pytest.mark.parametrize("iid", sorted(TASKS))
def test_patch_breaking_pass_to_pass_is_not_resolved(iid: str, tmp_path: Path):
    task = TASKS[iid]
    r = grade(task, make_patch(task, tmp_path, EDITS[iid]["breaks_p2p"], on_gold=True))
    assert r.failure_kind == FailureKind.none, r.log_tail
    assert set(r.fail_to_pass.values()) == {"PASSED"}, "the issue itself is fixed"
    assert any(s in ("FAILED", "ERROR") for s in r.pass_to_pass.values())
    assert not r.resolved and r.reward == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("iid", sorted(TASKS))
def test_non_applying_patch_is_apply_failed(iid: str):
    bogus = (
        "diff --git a/src/no_such_module.py b/src/no_such_module.py\n--- a/src/no_such_module.py\n"
        "+++ b/src/no_such_module.py\n@@ -1,2 +1,2 @@\n import os\n-x = 1\n+x = 2\n"
    )
    r = grade(TASKS[iid], bogus)
    assert r.failure_kind == FailureKind.apply_failed and not r.patch_applied
    assert r.apply_method == ApplyMethod.none and not r.resolved


@pytest.mark.slow
@pytest.mark.parametrize("iid", sorted(TASKS))
def test_grading_is_not_vacuous(iid: str):
    """With FAIL_TO_PASS emptied, the gold patch must not count as resolved."""
    task = TASKS[iid]
    emptied = task.model_copy(update={"FAIL_TO_PASS": []})
    r = grade(emptied, task.patch)
    assert not r.resolved and r.reward == 0.0
    assert r.failure_kind == FailureKind.task_defect and "vacuous" in r.error
    # And the F2P tests really run: without the fix they fail, not go missing.
    base_run = grade(
        task,
        "diff --git a/zz_unrelated.txt b/zz_unrelated.txt\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/zz_unrelated.txt\n@@ -0,0 +1 @@\n+x\n",
    )
    assert base_run.failure_kind == FailureKind.none and not base_run.resolved
    assert set(base_run.fail_to_pass.values()) <= {"FAILED", "ERROR"}


@pytest.mark.slow
def test_edits_to_test_files_are_reset(tmp_path: Path):
    """An agent cannot pass by rewriting the tests the test patch touches."""
    task = TASKS["pallets__flask-5014"]
    tree = materialize(task, tmp_path / "agent")
    (tree / "tests" / "test_blueprints.py").write_text("def test_empty_name_not_allowed():\n    pass\n")
    r = grade(task, tree_patch(tree))
    assert r.failure_kind == FailureKind.none and not r.resolved
    assert r.fail_to_pass == {"tests/test_blueprints.py::test_empty_name_not_allowed": "FAILED"}


@pytest.mark.slow
def test_hanging_tests_time_out(tmp_path: Path):
    task = TASKS["pallets__flask-5014"]
    patch = make_patch(
        task,
        tmp_path,
        [("src/flask/blueprints.py", "import os\n", "import os\nimport time\ntime.sleep(600)\n")],
        on_gold=False,
    )
    t0 = time.monotonic()
    r = grade(task, patch, timeout_s=5)
    assert time.monotonic() - t0 < 30
    assert r.failure_kind == FailureKind.test_timeout and not r.resolved
    assert sb.TESTS_TIMEOUT in r.log_tail


@pytest.mark.slow
def test_interpreter_crash_is_test_crash(tmp_path: Path):
    task = TASKS["pallets__flask-5014"]
    patch = make_patch(
        task,
        tmp_path,
        [("src/flask/blueprints.py", "import os\n", "import os\nos._exit(3)\n")],
        on_gold=False,
    )
    r = grade(task, patch)
    assert r.failure_kind == FailureKind.test_crash and not r.resolved


FLOOD = """

import atexit as _atexit
import os as _os


def _flood():
    chunk = b"x" * (1 << 20) + b"\\n"
    for _ in range(1024):
        _os.write(1, chunk)


_atexit.register(_flood)
"""


@pytest.mark.slow
def test_grader_memory_stays_bounded_when_tests_print_1gb(tmp_path: Path):
    """1 GiB of test output (in each mode) costs the grading process a bounded, small amount of memory."""
    task = TASKS["pallets__flask-5014"]
    tree = materialize(task, tmp_path / "agent")
    with open(tree / "src" / "flask" / "__init__.py", "a") as f:
        f.write(FLOOD)
    (tmp_path / "patch.diff").write_text(tree_patch(tree))
    script = (
        "import json, sys\n"
        "from polar_env.rewards.grading import grade\n"
        "from polar_env.tasks.loader import load_tasks\n"
        "task = next(t for t in load_tasks('bundled') if t.instance_id == 'pallets__flask-5014')\n"
        f"r = grade(task, open({str(tmp_path / 'patch.diff')!r}).read())\n"
        # VmHWM, not ru_maxrss: Linux carries a forking parent's high-water mark (pytest's, GBs with
        # the models loaded) across exec into ru_maxrss; VmHWM belongs to this process's own memory
        "hwm = next(int(line.split()[1]) for line in open('/proc/self/status') if "
        "line.startswith('VmHWM:'))\nprint(json.dumps({'rss_kb': hwm,\n"
        "                  'result': r.model_dump(mode='json')}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    result = out["result"]
    for mode in ("strict", "swebench"):
        output = result["modes"][mode]["output"]
        assert output["bytes"] >= 1 << 30 and output["dropped_bytes"] > 1 << 29, (mode, output)
    assert "note:output-truncated" in result["flags"] and result["reward"] == 0.0
    print(f"\n1 GiB per mode printed; grader peak RSS {out['rss_kb'] / 1024:.0f} MiB")
    assert out["rss_kb"] < 400 * 1024, f"grader peak RSS {out['rss_kb'] / 1024:.0f} MiB"


def test_missing_environment_is_infrastructure():
    task = TASKS["pallets__flask-5014"]
    broken = task.model_copy(
        update={"environment": TaskEnvironment(python="9.99", requirements=["pytest==7.3.1"])}
    )
    r = grade(broken, task.patch)
    assert r.failure_kind == FailureKind.infrastructure and r.is_infrastructure_failure
    assert "python9.99" in r.error and not r.resolved


@pytest.mark.slow
def test_grading_sandbox_has_no_network(tmp_path: Path):
    # A real listener on the host's loopback: reachable from here, not from the sandbox.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    threading.Thread(target=lambda: srv.accept(), daemon=True).start()
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    probe = (
        "import socket\n"
        "def try_(f):\n"
        "    try:\n        f(); return 'open'\n"
        "    except OSError as e:\n        return 'blocked'\n"
        f"print('host-loopback', try_(lambda: socket.create_connection(('127.0.0.1', {port}), timeout=2)))\n"
        "print('outside', try_(lambda: socket.create_connection(('1.1.1.1', 80), timeout=2)))\n"
        "print('dns', try_(lambda: socket.getaddrinfo('pypi.org', 443)))\n"
    )
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "probe.py").write_text(probe)
    venv = ensure_task_env(TASKS["pallets__flask-5014"])
    run = run_sandboxed("python probe.py", tree=tree, venv=venv, timeout_s=30)
    srv.close()
    assert "host-loopback blocked" in run.output, run.output
    assert "outside blocked" in run.output and "dns blocked" in run.output


@pytest.mark.slow
def test_grading_sandbox_is_not_root_and_venv_is_read_only(tmp_path: Path):
    tree = tmp_path / "tree"
    tree.mkdir()
    venv = ensure_task_env(TASKS["pallets__flask-5014"])
    run = run_sandboxed(
        "id -u; touch /opt/venv/x 2>/dev/null && echo venv-writable || echo venv-ro; "
        "python -m pip --version >/dev/null 2>&1 && echo has-pip || echo no-pip",
        tree=tree,
        venv=venv,
        timeout_s=30,
    )
    lines = run.output.split()
    assert lines[0] != "0" and "venv-ro" in lines and "no-pip" in lines, run.output


def test_grade_result_serialises():
    r = GradeResult(instance_id="x", failure_kind=FailureKind.test_timeout)
    assert GradeResult.model_validate_json(r.model_dump_json()) == r

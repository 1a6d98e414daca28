"""Conformance with the `harbor` package itself (0.25.0, in .venv-harbor: scripts/setup_harbor.sh):
harbor's own task model accepts every folder `polar tasks export --format harbor` writes (the
bundled SWE-bench tasks and the terminal Harbor tasks), and Polar loads harbor's template task."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import REPO

from polar_env.tasks.harbor import load_task_dir
from polar_env.tasks.loader import load_tasks

HARBOR_PY = REPO / ".venv-harbor" / "bin" / "python"
pytestmark = pytest.mark.skipif(not HARBOR_PY.exists(), reason="needs .venv-harbor (scripts/setup_harbor.sh)")

CHECK = """
import json, sys, warnings
from pathlib import Path
from harbor.models.task.task import Task
warnings.simplefilter("error", DeprecationWarning)  # an export must not use deprecated fields
out = {}
for d in sys.argv[1:]:
    t = Task(d)
    out[Path(d).name] = {"valid": Task.is_valid_dir(d), "name": t.name, "instruction": t.instruction,
                         "verifier_timeout": t.config.verifier.timeout_sec,
                         "network": t.config.environment.network_mode.value, \
"workdir": t.config.environment.workdir}
print(json.dumps(out))
"""


def _harbor(*args: str) -> str:
    proc = subprocess.run([str(HARBOR_PY), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_harbor_accepts_every_exported_folder(tmp_path: Path):
    out = tmp_path / "export"
    for spec in ("bundled", "terminal"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "polar_env.cli",
                "tasks",
                "export",
                "--format",
                "harbor",
                "--tasks",
                spec,
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    tasks = load_tasks("bundled") + load_tasks("terminal")
    folders = sorted(out.iterdir())
    assert [f.name for f in folders] == sorted(t.instance_id for t in tasks)
    seen = json.loads(_harbor("-c", CHECK, *map(str, folders)))
    for task in tasks:
        got = seen[task.instance_id]
        assert got["valid"], task.instance_id
        assert got["network"] == "no-network" and got["workdir"] in (None, task.workdir)
        assert got["instruction"].strip() and got["verifier_timeout"] > 0
    # harbor lint with every rule: only the two findings docs/tasks.md explains, on the SWE exports only
    bin_harbor = HARBOR_PY.parent / "harbor"
    lint = subprocess.run(
        [str(bin_harbor), "lint", "--select", "ALL", "--json", *map(str, folders)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    findings = json.loads(lint.stdout)
    by_rule = {(Path(f["path"]).relative_to(out).parts[0], f["rule"]) for f in findings}
    swe = {t.instance_id for t in tasks if t.harbor is None}
    expected = {(tid, rule) for tid in swe for rule in ("shared-verifier", "unpinned-image")}
    assert {(t, r) for t, r in by_rule if t in swe} == expected, findings
    # every folder builds anywhere: FROM the public image Polar's base is made from (mapped here)
    assert all(
        (f / "environment" / "Dockerfile").read_text().count("FROM debian:bookworm-slim\n") == 1
        for f in folders
    )
    # and they load back in Polar with the same prompt
    for task in tasks:
        back = load_task_dir(out / task.instance_id)
        assert back.harbor is not None and back.workdir == task.workdir
        if task.harbor is not None:
            assert back.problem_statement == task.problem_statement


def test_polar_loads_harbors_template_task():
    site = _harbor("-c", "import harbor, pathlib; print(pathlib.Path(harbor.__file__).parent)").strip()
    template = Path(site) / "cli" / "template-task"
    task = load_task_dir(template)
    assert task.instance_id == "template-task" and task.workdir == "/app"  # the Dockerfile's WORKDIR
    assert task.harbor.config.verifier.timeout_sec == 900.0 and task.harbor.config.agent.timeout_sec == 900.0
    assert task.harbor.config.schema_version == "1.4"


FIXTURES = REPO / "tests" / "fixtures" / "harbor"
READ = """
import json, sys
from pathlib import Path
from harbor.models.task.task import Task
from harbor.models.task.verifier_mode import resolve_task_verifier_mode
out = {}
for d in sys.argv[1:]:
    c = Task(d).config
    out[Path(d).name] = {"separate": resolve_task_verifier_mode(c).value == "separate", \
"agent_user": c.agent.user,
                         "verifier_user": c.verifier.user, "collect": [h.command for h in c.verifier.collect],
                         "artifacts": [a if isinstance(a, str) else a.source for a in c.artifacts]}
print(json.dumps(out))
"""


def test_harbor_reads_the_fixture_tasks_as_polar_does():
    """The fields Polar acts on for a separate verifier, artifacts, collect hooks and users mean the
    same to harbor's own model, for every Harbor fixture folder."""
    folders = sorted(p for p in FIXTURES.iterdir() if (p / "task.toml").is_file())
    seen = json.loads(_harbor("-c", READ, *map(str, folders)))
    for folder in folders:
        cfg = load_task_dir(folder).harbor.config
        extra = cfg.verifier.model_extra or {}
        mine = {
            "separate": cfg.verifier.separate,
            "agent_user": cfg.agent.user,
            "verifier_user": cfg.verifier.user,
            "collect": [h["command"] for h in extra.get("collect", [])],
            "artifacts": [a if isinstance(a, str) else a["source"] for a in cfg.artifacts],
        }
        assert seen[folder.name] == mine, folder.name
    assert seen["separate-verifier"]["separate"] and seen["agent-user"]["agent_user"] == "tester"


RESOLVE = """
import json, sys
from harbor.utils.env import resolve_env_vars
out = {}
for name, env in json.loads(sys.argv[1]).items():
    try:
        out[name] = resolve_env_vars(env)
    except ValueError:
        out[name] = None
print(json.dumps(out))
"""


def test_task_env_resolves_as_harbors_does(monkeypatch):
    """``[environment] env`` / ``[verifier] env`` values mean the same to Polar as to harbor's own
    resolver, run with the same host environment: literals, ``${VAR}``, ``${VAR:-default}`` (set but
    empty stays empty), an embedded template kept literal, and an unset ``${VAR}`` refused."""
    from polar_env.tasks.harbor_env import HarborEnvError, resolve

    monkeypatch.setenv("POLAR_CONF_SET", "v1")
    monkeypatch.setenv("POLAR_CONF_EMPTY", "")
    monkeypatch.delenv("POLAR_CONF_UNSET", raising=False)
    cases = {
        "values": {
            "LIT": "plain",
            "SET": "${POLAR_CONF_SET}",
            "DFLT": "${POLAR_CONF_UNSET:-d}",
            "EMPTYSET": "${POLAR_CONF_EMPTY:-d}",
            "NODFLT": "${POLAR_CONF_UNSET:-}",
            "EMBED": "x${POLAR_CONF_SET}y",
            "DOLLAR": "$POLAR_CONF_SET",
            "COLON": "${A:B}",
        },
        "unset": {"X": "${POLAR_CONF_UNSET}"},
    }
    seen = json.loads(_harbor("-c", RESOLVE, json.dumps(cases)))
    for name, env in cases.items():
        try:
            mine: dict[str, str] | None = resolve(env, "t")
        except HarborEnvError:
            mine = None
        assert seen[name] == mine, name
    assert seen["values"]["SET"] == "v1" and seen["unset"] is None

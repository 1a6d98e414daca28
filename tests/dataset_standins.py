"""Local stand-ins for the images the SWE datasets publish (no registry is reachable here): a bundled task's
image (tasks/images.py) rearranged into one dataset's published layout, tagged with the name that
dataset's loader gives the task, so a row in the dataset's own schema runs as a user's would after
``podman pull``. Built once per machine (tagged by their inputs), shared by the tests that use them.

SWE-Gym and SWE-rebench (their images are SWE-bench's, built by their forks of SWE-bench's harness):
the task environment is a conda
environment ``testbed`` that only ``source /opt/miniconda3/bin/activate; conda activate testbed`` puts
on PATH (nothing of it is on the image's own PATH: a grader that skips the activation has no pytest),
the repository installed into it in place (a ``.pth`` of /testbed, what ``pip install -e .`` leaves),
and /testbed a clone checked out at the base with the fix reachable in a later commit (a branch and a
tag), so the history reduction (sandbox/history.py) is exercised. conda itself is not installed: its
``bin/activate`` is a shell stand-in doing what those two lines do.

SWE-rebench V2 (its ``combine.Dockerfile.j2`` on a ``python:3.11``-style base): the image's own Python on
PATH with the repository installed in it (a ``.pth``), the repository at ``/<repo name>``, a clone reset
(``git reset --hard``) to the base from a later commit holding the fix (kept by the reflog and the object
store, no ref), its origin removed, the tree ``chmod -R 777``; the row's test command a list.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from polar_env.sandbox.container import engine_run, image_exists
from polar_env.tasks.datasets import DATASETS
from polar_env.tasks.images import VENV, ensure_task_image
from polar_env.tasks.models import Task, patch_files

CONDA = "/opt/miniconda3"
TESTBED_ENV = f"{CONDA}/envs/testbed"
# conda's bin/activate, reduced to what SWE-bench's eval scripts use of it
ACTIVATE = r"""# stand-in for conda's activate: `source activate [ENV]` defines `conda activate ENV`
conda() {
  [ "${1:-}" = activate ] || { echo "conda (stand-in): only 'conda activate ENV'" >&2; return 1; }
  _env=/opt/miniconda3/envs/${2:-base}
  [ -d "$_env" ] || { echo "EnvironmentNameNotFound: ${2:-base}" >&2; return 1; }
  export PATH="$_env/bin:$PATH" CONDA_PREFIX="$_env" CONDA_DEFAULT_ENV="${2:-base}"
}
if [ -n "${1:-}" ]; then conda activate "$1"; fi
"""
# run as root in /testbed of the bundled task's image: its venv becomes the conda env, the tree an install
# in it
CONDA_ENV = f"""set -eu
for f in {VENV}/bin/*; do [ -L "$f" ] \
|| sed -i '1s|^#!{VENV}/bin/python|#!{TESTBED_ENV}/bin/python|' "$f"; done
mkdir -p {CONDA}/bin {CONDA}/envs && mv {VENV} {TESTBED_ENV}
cp /tmp/layer/activate {CONDA}/bin/activate
cp /tmp/layer/testbed.pth "$(echo {TESTBED_ENV}/lib/python3*/site-packages)/"
g() {{ git -c user.name=dev -c user.email=dev@example.com "$@"; }}
export GIT_AUTHOR_DATE=2030-01-01T00:00:00Z GIT_COMMITTER_DATE=2030-01-01T00:00:00Z
"""
# ... and the fix a later commit (SWE-Gym's, SWE-rebench's)
CONDA_SETUP = (
    CONDA_ENV
    + """base=$(git rev-parse HEAD); branch=$(git symbolic-ref --short HEAD)
g checkout -qb upstream && git apply /tmp/layer/fix.patch && g add -A && \
g commit -qm "the fix" && g tag v-fixed
g checkout -q "$branch"
[ "$(git rev-parse HEAD)" = "$base" ]
"""
)
PLAIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def swe_gym_row(task: Task) -> dict:
    """``task`` as a row of SWE-Gym's published schema (the dataset card's columns)."""
    return {
        "instance_id": task.instance_id,
        "repo": task.repo,
        "base_commit": task.base_commit,
        "patch": task.patch,
        "test_patch": task.test_patch,
        "problem_statement": task.problem_statement,
        "hints_text": task.hints_text,
        "created_at": "2020-01-01T00:00:00Z",
        "version": task.version or "0.0",
        "FAIL_TO_PASS": task.FAIL_TO_PASS,
        "PASS_TO_PASS": task.PASS_TO_PASS,
    }


def swe_rebench_row(task: Task) -> dict:
    """``task`` as a row of SWE-rebench's (v1) schema: SWE-bench's columns and the row's ``install_config``
    (the environment recipe its fork builds the image from; here its test command and parser)."""
    return {
        **swe_gym_row(task),
        "environment_setup_commit": task.base_commit,
        "install_config": {
            "python": task.environment.python,
            "install": "pip install -e .",
            "test_cmd": "pytest --no-header -rA --tb=no",
            "log_parser": "parse_log_pytest",
        },
    }


# tests SWE-bench lists as passing that V2's rows would not: xfail under the gold patch (V2's parsers know
# no XFAIL status, and its verdict wants the passed tests exactly)
V2_UNLISTED = {
    "psf__requests-5414": ("tests/test_requests.py::TestRequests::test_response_iter_lines_reentrant",)
}


# ... and SWE-smith's repository: ``main`` the clean snapshot (the fix and its tests in; its suite the fix's
# test files only, to keep the stand-in fast), the instance a branch of two commits on it: the bug (the fix
# undone), then the FAIL_TO_PASS test files removed; HEAD on main, as SWE-smith's images are
SMITH_SETUP = (
    CONDA_ENV
    + """git apply /tmp/layer/fix.patch
for f in tests/test_*.py; do grep -qx "$f" /tmp/layer/tests.txt || rm "$f"; done
g add -A && g commit -qm "the snapshot"
g checkout -qb "$POLAR_INSTANCE"
git apply -R /tmp/layer/gold.patch && g commit -qam "the bug"
g rm -q $(cat /tmp/layer/f2p.txt) && g commit -qm "Remove F2P Tests"
g checkout -q -
"""
)


def swe_smith_row(task: Task, engine: str = "podman") -> dict:
    """``task`` as a row of SWE-smith's schema (``harness/gather.py``), its stand-in image built first and
    tagged as SWE-smith names it; the bug patch as the dataset keeps it (git's diff of the snapshot to the
    bug commit)."""
    owner, repo = task.repo.split("/")
    snapshot = f"{owner}__{repo}.{task.base_commit[:8]}"
    iid = f"{snapshot}.func_pm_standin__{task.instance_id.rsplit('-', 1)[-1]}"
    tests = sorted({t.split("::", 1)[0] for t in task.FAIL_TO_PASS})
    files = {
        **conda_files(task, SMITH_SETUP),
        "gold.patch": task.patch,
        "tests.txt": "".join(f + "\n" for f in task.test_files()),
        "f2p.txt": " ".join(tests) + "\n",
    }
    tag = build_layer(
        engine,
        ensure_task_image(task, engine),
        f"polar-standin/swe-smith-{task.instance_id.lower()}",
        files,
        f"cd /testbed && POLAR_INSTANCE={iid} sh /tmp/layer/setup.sh",
        tail=f'ENV PATH={PLAIN_PATH}\nENV VIRTUAL_ENV=""\nWORKDIR /testbed\n',
    )
    image = f"jyangballin/swesmith.x86_64.{owner}_1776_{repo}.{task.base_commit[:8]}"
    engine_run([engine, "tag", tag, image])
    git = [engine, "run", "--rm", "--network", "none", tag, "git"]
    bug = engine_run([*git, "diff", "main", f"{iid}~1"]).decode()
    return {
        "instance_id": iid,
        "repo": f"swesmith/{snapshot}",
        "patch": bug,
        "FAIL_TO_PASS": task.FAIL_TO_PASS,
        # not the ids SWE-bench's -rA parser cut at a space ("...[a-b" of "...[a-b c]"): SWE-smith's --verbose
        # parser never reports those tests, so its rows do not list them
        "PASS_TO_PASS": [t for t in task.PASS_TO_PASS if t.count("[") == t.count("]")],
        "created_at": "2030-01-01T00:00:00",
        "image_name": image,
        "base_commit": engine_run([*git, "rev-parse", "main"]).decode().strip(),
        "problem_statement": task.problem_statement,
    }


def swe_rebench_v2_row(task: Task) -> dict:
    """``task`` as a row of SWE-rebench V2's schema (its ``sample.json``): the test command a list, V2's own
    parser, the image at the top level (the stand-in's tag)."""
    row = {k: v for k, v in swe_gym_row(task).items() if k != "version"}
    row["PASS_TO_PASS"] = [t for t in task.PASS_TO_PASS if t not in V2_UNLISTED.get(task.instance_id, ())]
    return {
        **row,
        "language": "python",
        "interface": "",
        "pr_description": task.problem_statement,
        "meta": {},
        "install_config": {
            "base_image_name": "python_3.11",
            "install": ["pip install -e ."],
            "test_cmd": ["pytest -rA --tb=no -p no:cacheprovider " + " ".join(task.test_directives)],
            "log_parser": "parse_log_pytest",
        },
        "image_name": f"docker.io/swerebenchv2/{task.repo.replace('/', '-')}:"
        f"{task.instance_id.rsplit('-', 1)[-1]}-{task.base_commit[:7]}",
    }


def build_layer(
    engine: str, base_image: str, name: str, files: dict[str, str], run: str, tail: str = ""
) -> str:
    """``base_image`` with ``files`` in /tmp/layer and ``run`` (shell, as root) run there, no network; built
    once, tagged ``localhost/<name>:<a hash of its inputs, the base's image id among them>``."""
    containerfile = f"FROM {base_image}\nCOPY layer /tmp/layer\nRUN {run} && rm -rf /tmp/layer\n{tail}"
    base_id = engine_run([engine, "image", "inspect", "--format", "{{.Id}}", base_image]).decode().strip()
    key = hashlib.sha256("\0".join([containerfile, base_id, *files, *files.values()]).encode()).hexdigest()[
        :16
    ]
    tag = f"localhost/{name}:{key}"
    if not image_exists(engine, tag):
        with tempfile.TemporaryDirectory(prefix="polar-layer-") as tmp:
            (Path(tmp) / "layer").mkdir()
            for file, text in files.items():
                (Path(tmp) / "layer" / file).write_text(text)
            (Path(tmp) / "Containerfile").write_text(containerfile)
            engine_run(
                [engine, "build", "--network", "none", "-t", tag, "-f", f"{tmp}/Containerfile", tmp],
                timeout_s=900,
            )
    return tag


def conda_files(task: Task, setup: str) -> dict[str, str]:
    """The layer files of a conda-layout stand-in: ``setup`` (run in /testbed), conda's ``activate``, a
    ``.pth`` of the task's in-tree import roots, the fix and its tests as one patch."""
    pth = "".join(
        p.replace("{testbed}", "/testbed") + "\n"
        for p in task.environment.env.get("PYTHONPATH", "{testbed}").split(":")
    )
    return {
        "setup.sh": setup,
        "activate": ACTIVATE,
        "testbed.pth": pth,
        "fix.patch": task.patch + task.test_patch,
    }


def conda_standin(task: Task, name: str, engine: str = "podman") -> str:
    """The stand-in of a SWE-bench-layout dataset image (SWE-Gym's, SWE-rebench's) for the bundled ``task``,
    tagged ``name`` (the loader's image name)."""
    files = conda_files(task, CONDA_SETUP)
    tag = build_layer(
        engine,
        ensure_task_image(task, engine),
        f"polar-standin/conda-{task.instance_id.lower()}",
        files,
        "cd /testbed && sh /tmp/layer/setup.sh",
        tail=f'ENV PATH={PLAIN_PATH}\nENV VIRTUAL_ENV=""\nWORKDIR /testbed\n',
    )
    engine_run([engine, "tag", tag, name])
    return tag


# run as root in /testbed of the bundled task's image: the repository installed in the image's Python (a
# .pth), the fix a commit on top of the base ($base)
FIX_ON_TOP = f"""set -eu
cp /tmp/layer/repo.pth "$(echo {VENV}/lib/python3*/site-packages)/"
g() {{ git -c user.name=dev -c user.email=dev@example.com "$@"; }}
export GIT_AUTHOR_DATE=2030-01-01T00:00:00Z GIT_COMMITTER_DATE=2030-01-01T00:00:00Z
base=$(git rev-parse HEAD)
git apply /tmp/layer/fix.patch && g add -A && g commit -qm "the fix"
"""
# ... then the repository moved to /<repo>, reset to the base from the fix's commit, its origin removed
V2_SETUP = (
    FIX_ON_TOP
    + """g remote add origin https://example.com/repo.git
g reset -q --hard "$base" && g remote remove origin
cd / && mv /testbed "$POLAR_REPO_DIR" && chmod -R 777 "$POLAR_REPO_DIR"
"""
)


def rebench_v2_standin(task: Task, name: str, engine: str = "podman") -> str:
    """The stand-in of SWE-rebench V2's image for the bundled ``task``, tagged ``name`` (the row's
    ``image_name``); the repository at ``/<repo name>``."""
    workdir = "/" + task.repo.split("/")[-1]
    files = {"setup.sh": V2_SETUP, "repo.pth": workdir + "\n", "fix.patch": task.patch + task.test_patch}
    tag = build_layer(
        engine,
        ensure_task_image(task, engine),
        f"polar-standin/rebench-v2-{task.instance_id.lower()}",
        files,
        f"cd /testbed && POLAR_REPO_DIR={workdir} sh /tmp/layer/setup.sh",
        tail=f"WORKDIR {workdir}\n",
    )
    engine_run([engine, "tag", tag, name])
    return tag


# run as root in /testbed of the bundled task's image (R2E-Gym's base Dockerfiles): the task's venv moved to
# /testbed/.venv, the repository a clone at the base (detached) with the fix on its branch, the fix's tests
# in /r2e_tests (the bundled requests task's test package at the fix), run_tests.sh and install.sh in the
# tree (untracked)
R2E_SETUP = f"""set -eu
for f in {VENV}/bin/*; do [ -L "$f" ] \\
|| sed -i '1s|^#!{VENV}/bin/python|#!/testbed/.venv/bin/python|' "$f"; done
mv {VENV} /testbed/.venv
cp /tmp/layer/testbed.pth "$(echo /testbed/.venv/lib/python3*/site-packages)/"
g() {{ git -c user.name=dev -c user.email=dev@example.com "$@"; }}
export GIT_AUTHOR_DATE=2030-01-01T00:00:00Z GIT_COMMITTER_DATE=2030-01-01T00:00:00Z
printf '.venv/\n' >> .git/info/exclude
base=$(git rev-parse HEAD)
git apply /tmp/layer/fix.patch && cp -a tests /r2e_tests && g add -A && g commit -qm "the fix"
for f in /r2e_tests/test_*.py; do grep -qx "$f" /tmp/layer/tests.txt || rm "$f"; done
g checkout -q --detach "$base"
cp /tmp/layer/run_tests.sh /tmp/layer/install.sh /testbed/
"""
# R2E-Gym's tests_cmd for its repositories (docs/ENV_GENERATION.md)
R2E_RUN_TESTS = (
    "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' .venv/bin/python -W ignore -m pytest -rA "
    "r2e_tests\n"
)


def r2e_parsed_commit(patch: str, old: str, new: str) -> dict:
    """``patch`` as R2E-Gym's ``ParsedCommit`` (its ``parsed_commit_content``): file diffs of header, index
    line, ---/+++ files and hunks of typed lines."""
    diffs: list[dict] = []
    for block in re.split(r"^(?=diff --git )", patch, flags=re.M):
        if not block.startswith("diff --git "):
            continue
        lines = block.rstrip("\n").split("\n")
        path = lines[0].split(" b/", 1)[1]
        diff: dict = {"old_file_content": "", "new_file_content": "", "hunks": [], "is_binary_file": False}
        diff["header"] = {"file": {"path": path}, "misc_line": None}
        for line in lines[1:]:
            if line.startswith("index "):
                hashes, _, mode = line[6:].partition(" ")
                a, b = hashes.split("..")
                diff["index_line"] = {"old_commit_hash": a, "new_commit_hash": b, "mode": mode}
            elif line.startswith("--- "):
                diff["minus_file"] = {"path": line[4:]}
            elif line.startswith("+++ "):
                diff["plus_file"] = {"path": line[4:]}
            elif m := re.match(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)", line):
                rng = [
                    {"start": int(m[i]), "length": None if m[i + 1] is None else int(m[i + 1])}
                    for i in (1, 3)
                ]
                descriptor = {"old_range": rng[0], "new_range": rng[1], "section": m[5]}
                diff["hunks"].append({"descriptor": descriptor, "line_group": {"all_lines": []}})
            elif diff["hunks"]:
                kind = {" ": "context", "+": "added", "-": "deleted", "\\": "note"}[line[:1] or " "]
                content = line[2:] if kind == "note" else line[1:]
                diff["hunks"][-1]["line_group"]["all_lines"].append({"content": content, "type": kind})
            else:
                diff["header"]["misc_line"] = line
        diffs.append(diff)
    return {
        "file_diffs": diffs,
        "old_commit_hash": old,
        "new_commit_hash": new,
        "commit_message": "the fix",
        "commit_date": "2030-01-01T00:00:00Z",
        "metadata": {},
    }


def r2e_gym_row(task: Task, engine: str = "podman") -> dict:
    """``task`` as a row of R2E-Gym's schema, its stand-in image built first and tagged as R2E-Gym names it
    (``namanjain12/<repo>_final:<the fix's commit>``): the expected statuses are the gold patch's run in it,
    parsed R2E-Gym's way (how R2E-Gym's rows were made)."""
    from polar_env.tasks.datasets.r2e_gym import parse_log

    repo = task.repo.split("/")[-1]
    files = {
        "setup.sh": R2E_SETUP,
        "testbed.pth": "/testbed\n",
        "fix.patch": task.patch + task.test_patch,
        "run_tests.sh": R2E_RUN_TESTS,
        "install.sh": "uv pip install -e .\n",
        # R2E-Gym's tests are the fix's tests of the changed code: here the test patch's files only
        "tests.txt": "".join(f"/r2e_tests/{f.split('/', 1)[1]}\n" for f in task.test_files()),
    }
    tag = build_layer(
        engine,
        ensure_task_image(task, engine),
        f"polar-standin/r2e-gym-{task.instance_id.lower()}",
        files,
        "cd /testbed && sh /tmp/layer/setup.sh",
        tail=f"ENV VIRTUAL_ENV=/testbed/.venv\nENV PATH=/testbed/.venv/bin:{PLAIN_PATH}\nWORKDIR /testbed\n",
    )
    gold = subprocess.run(
        # as R2E-Gym's harness runs them: the tests linked into the tree, the script from the tree
        in_image(
            engine,
            tag,
            "cd /testbed && git rev-parse HEAD && git apply && ln -s /r2e_tests r2e_tests && "
            "bash run_tests.sh; true",
            "-i",
        ),
        input=task.patch,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    base = gold.split("\n", 1)[0]
    fix = engine_run([engine, "run", "--rm", "--network", "none", tag, "git", "rev-parse", "--all"])
    commit = next(c for c in fix.decode().split() if c != base)
    engine_run([engine, "tag", tag, f"namanjain12/{repo}_final:{commit}"])
    return {
        "repo_name": repo,
        "docker_image": f"namanjain12/{repo}_final:{commit}",
        "commit_hash": commit,
        "parsed_commit_content": json.dumps(r2e_parsed_commit(task.patch, base, commit)),
        "execution_result_content": "{}",
        "modified_files": json.dumps(patch_files(task.patch)),
        "modified_entity_summaries": "[]",
        "relevant_files": "[]",
        "num_non_test_files": str(len(patch_files(task.patch))),
        "num_non_test_func_methods": "1",
        "num_non_test_lines": str(task.patch.count("\n+") + task.patch.count("\n-")),
        "prompt": "",
        "problem_statement": f"[ISSUE]\n{task.problem_statement}\n[/ISSUE]",
        "expected_output_json": json.dumps(parse_log(gold)),
    }


# run as root in /testbed of the bundled task's image (SWE-bench Pro's layout): the repository moved to
# /app, installed in the image's own Python, the fix in a later commit on another branch
PRO_SETUP = f"""set -eu
cp /tmp/layer/app.pth "$(echo {VENV}/lib/python3*/site-packages)/"
g() {{ git -c user.name=dev -c user.email=dev@example.com "$@"; }}
export GIT_AUTHOR_DATE=2030-01-01T00:00:00Z GIT_COMMITTER_DATE=2030-01-01T00:00:00Z
branch=$(git symbolic-ref --short HEAD)
g checkout -qb fix && git apply /tmp/layer/fix.patch && g add -A && g commit -qm "the fix"
g checkout -q "$branch"
cd / && mv /testbed /app
"""
# the instance's scripts, written the way SWE-bench_Pro-os's run_scripts/<instance>/ are: the selected test
# files comma-joined in one argument, pytest -v; the parser reads its lines into output.json
PRO_RUN_SCRIPT = r"""#!/bin/bash
set -e
run_selected_tests() {
  python -m pytest -v --disable-warnings -p no:cacheprovider "$@" 2>&1
}
if [[ "$1" == *","* ]]; then IFS=',' read -r -a TEST_FILES <<< "$1"; else TEST_FILES=("$@"); fi
run_selected_tests "${TEST_FILES[@]}"
"""
PRO_PARSER = r"""import json
import re
import sys

STATUS = {"PASSED": "PASSED", "XFAIL": "PASSED", "FAILED": "FAILED", "XPASS": "FAILED"}
stdout, stderr, output = sys.argv[1:4]
tests = {}
for line in open(stdout, errors="replace").read().split("\n"):
    m = re.match(r"^([^\s]+::[^\s]+)\s+(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)", line.strip())
    if m and m.group(1) not in tests:
        tests[m.group(1)] = STATUS.get(m.group(2), m.group(2))
json.dump({"tests": [{"name": k, "status": v} for k, v in tests.items()]}, open(output, "w"), indent=2)
"""


def swe_bench_pro_row(task: Task, engine: str = "podman") -> dict:
    """``task`` as a row of SWE-bench Pro's schema (its list columns Python literals in strings, as the
    dataset keeps them), its stand-in image built first and tagged as Pro names it; the instance's
    ``run_script.sh`` and ``parser.py`` in the row's own columns (a test moves them to ``run_scripts/``)."""
    owner, repo = task.repo.split("/")
    iid = f"instance_{owner}__{repo}-{task.base_commit}-v{task.instance_id.rsplit('-', 1)[-1]}"
    files = {"setup.sh": PRO_SETUP, "app.pth": "/app\n", "fix.patch": task.patch + task.test_patch}
    tag = build_layer(
        engine,
        ensure_task_image(task, engine),
        f"polar-standin/swe-bench-pro-{task.instance_id.lower()}",
        files,
        "cd /testbed && sh /tmp/layer/setup.sh",
        tail="WORKDIR /app\n",
    )
    dockerhub_tag = f"{owner}.{repo}-{iid}".lower()[:128]
    engine_run([engine, "tag", tag, f"jefzda/sweap-images:{dockerhub_tag}"])
    return {
        "repo": task.repo,
        "instance_id": iid,
        "base_commit": task.base_commit,
        "patch": task.patch,
        "test_patch": task.test_patch,
        "problem_statement": task.problem_statement,
        "requirements": "Keep the public API as it is.",
        "interface": "No new interfaces are introduced.",
        "repo_language": "python",
        "fail_to_pass": repr(task.FAIL_TO_PASS),
        # not the ids SWE-bench's -rA parser cut at a space: Pro's parser never reports those tests
        "pass_to_pass": repr([t for t in task.PASS_TO_PASS if t.count("[") == t.count("]")]),
        "issue_specificity": "['edge_case_bug']",
        "issue_categories": "['web_knowledge']",
        "before_repo_set_cmd": f"git reset --hard {task.base_commit}\ngit checkout fix -- "
        + " ".join(task.test_files()),
        "selected_test_files_to_run": repr(task.test_files()),
        "dockerhub_tag": dockerhub_tag,
        "run_script": PRO_RUN_SCRIPT,
        "parser": PRO_PARSER,
    }


# run as root in /testbed of the bundled task's image (Multi-SWE-bench's Python images: ``git clone`` into
# /home/<repo>, ``git checkout <base>``): the repository moved to /home/<repo>, installed in the image's
# Python, HEAD detached at the base, the fix a later commit on main with the origin kept; the class's /home
# files (the gold fix among them) beside it
MSB_SETUP = (
    FIX_ON_TOP
    + """g remote add origin "https://github.com/$POLAR_REPO.git"
g checkout -q --detach "$base"
cd / && mv /testbed "$POLAR_REPO_DIR"
for f in /tmp/layer/home-*; do cp "$f" "/home/${f#/tmp/layer/home-}"; done
"""
)
# the package's class this stand-in's row names (its ``number_interval``): a Python one, the image from
# ``python:3.9-slim`` with pytest -rA, its parser reading the summary's PASSED/FAILED lines
MSB_CLASS = "flask_5634_to_5058"


def multi_swe_bench_row(task: Task, engine: str = "podman") -> dict:
    """``task`` as a row of Multi-SWE-bench's schema, its stand-in image built first with the ``/home`` files
    of the package's own class and tagged as that class names it; the row's three stages (``run.sh``,
    ``test-run.sh``, ``fix-run.sh`` of the image, the gold fix the image's ``/home/fix.patch``) run in it
    and reported by the package, as its dataset builder does."""
    from multi_swe_bench.harness.report import generate_report

    from polar_env.tasks.datasets.multi_swe_bench import class_name, instance

    org, repo = task.repo.split("/")
    number = int(task.instance_id.rsplit("-", 1)[-1])
    made = instance.__wrapped__(class_name(org, repo, number_interval=MSB_CLASS), org, repo, number, "")
    assert not isinstance(made, str), made
    made.pr.fix_patch, made.pr.test_patch = task.patch, task.test_patch  # what its files are written from
    pth = "".join(
        p.replace("{testbed}", f"/home/{repo}") + "\n"
        for p in task.environment.env.get("PYTHONPATH", "{testbed}").split(":")
    )
    files = {
        "setup.sh": MSB_SETUP,
        "repo.pth": pth,
        "fix.patch": task.patch + task.test_patch,
        **{f"home-{f.name}": f.content for f in made.dependency().files()},
    }
    tag = build_layer(
        engine,
        ensure_task_image(task, engine),
        f"polar-standin/multi-swe-bench-{task.instance_id.lower()}",
        files,
        f"cd /testbed && POLAR_REPO={task.repo} POLAR_REPO_DIR=/home/{repo} sh /tmp/layer/setup.sh",
        tail=f"WORKDIR /home/{repo}\n",
    )
    image = made.name()
    engine_run([engine, "tag", tag, image])
    logs = [  # each stage's output, whatever the tests' exit status
        subprocess.run(
            [engine, "run", "--rm", "--network", "none", image, "bash", f"/home/{script}"],
            capture_output=True,
            text=True,
            timeout=600,
        ).stdout
        for script in ("run.sh", "test-run.sh", "fix-run.sh")
    ]
    report = json.loads(generate_report(made, *logs).json())
    assert report["valid"], report["error_msg"]
    return {
        "org": org,
        "repo": repo,
        "number": number,
        "state": "closed",
        "title": task.problem_statement.split("\n", 1)[0],
        "body": "",
        "base": {"label": f"{org}:main", "ref": "main", "sha": task.base_commit},
        "resolved_issues": [{"number": number - 1, "title": "", "body": task.problem_statement}],
        "fix_patch": task.patch,
        "test_patch": task.test_patch,
        "number_interval": MSB_CLASS,
        **{k: report[k] for k in ("fixed_tests", "p2p_tests", "f2p_tests", "s2p_tests", "n2p_tests")},
        **{k: report[k] for k in ("run_result", "test_patch_result", "fix_patch_result")},
        "instance_id": task.instance_id,
    }


def _standin(make_row: Callable[[Task], dict], make_image: Callable[[Task, str, str], str]):
    def build(task: Task, dataset: str, engine: str) -> dict:
        row = make_row(task)
        make_image(task, DATASETS[dataset].to_task(row).image, engine)
        return row

    return build


# each dataset with a stand-in: its builder (task, dataset, engine) -> the task's row, its image built under
# the name the loader gives the row (SWE-Gym's and SWE-rebench's images have SWE-bench's layout: one
# stand-in serves both)
STANDINS = {
    "swe-gym": _standin(swe_gym_row, conda_standin),
    "swe-rebench": _standin(swe_rebench_row, conda_standin),
    "swe-rebench-v2": _standin(swe_rebench_v2_row, rebench_v2_standin),
    "r2e-gym": lambda task, dataset, engine: r2e_gym_row(task, engine),
    "swe-smith": lambda task, dataset, engine: swe_smith_row(task, engine),
    "swe-bench-pro": lambda task, dataset, engine: swe_bench_pro_row(task, engine),
    "multi-swe-bench": lambda task, dataset, engine: multi_swe_bench_row(task, engine),
}


def standin_row(task: Task, dataset: str, engine: str = "podman") -> dict:
    """``task`` as a row of ``dataset``'s schema, its stand-in image built under the name the loader gives
    the row."""
    return STANDINS[dataset](task, dataset, engine)


def in_image(engine: str, image: str, script: str, *flags: str) -> list[str]:
    """argv: ``script`` in a throwaway container of ``image`` (no network), as root."""
    return [engine, "run", "--rm", "--network", "none", *flags, image, "bash", "-c", script]

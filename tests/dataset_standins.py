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
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from polar_env.sandbox.container import engine_run, image_exists
from polar_env.tasks.images import VENV, ensure_task_image
from polar_env.tasks.models import Task

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
# in it, the fix a later commit
CONDA_SETUP = f"""set -eu
for f in {VENV}/bin/*; do [ -L "$f" ] \
|| sed -i '1s|^#!{VENV}/bin/python|#!{TESTBED_ENV}/bin/python|' "$f"; done
mkdir -p {CONDA}/bin {CONDA}/envs && mv {VENV} {TESTBED_ENV}
cp /tmp/layer/activate {CONDA}/bin/activate
cp /tmp/layer/testbed.pth "$(echo {TESTBED_ENV}/lib/python3*/site-packages)/"
g() {{ git -c user.name=dev -c user.email=dev@example.com "$@"; }}
export GIT_AUTHOR_DATE=2030-01-01T00:00:00Z GIT_COMMITTER_DATE=2030-01-01T00:00:00Z
base=$(git rev-parse HEAD); branch=$(git symbolic-ref --short HEAD)
g checkout -qb upstream && git apply /tmp/layer/fix.patch && g add -A && \
g commit -qm "the fix" && g tag v-fixed
g checkout -q "$branch"
[ "$(git rev-parse HEAD)" = "$base" ]
"""
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


# the datasets whose images have SWE-bench's layout (conda `testbed`, /testbed): one stand-in serves them
ROWS = {"swe-gym": swe_gym_row, "swe-rebench": swe_rebench_row}


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


def conda_standin(task: Task, name: str, engine: str = "podman") -> str:
    """The stand-in of a SWE-bench-layout dataset image (SWE-Gym's, SWE-rebench's) for the bundled ``task``,
    tagged ``name`` (the loader's image name)."""
    pth = "".join(
        p.replace("{testbed}", "/testbed") + "\n"
        for p in task.environment.env.get("PYTHONPATH", "{testbed}").split(":")
    )
    files = {
        "setup.sh": CONDA_SETUP,
        "activate": ACTIVATE,
        "testbed.pth": pth,
        "fix.patch": task.patch + task.test_patch,
    }
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


def in_image(engine: str, image: str, script: str) -> list[str]:
    """argv: ``script`` in a throwaway container of ``image`` (no network), as root."""
    return [engine, "run", "--rm", "--network", "none", image, "bash", "-c", script]

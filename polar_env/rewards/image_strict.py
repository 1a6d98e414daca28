"""`strict` grading inside the task's own image: the bubblewrap grader's layers, run in a box of it.

A fresh box of the image (a container on podman and docker, an `ApptainerBox` on apptainer), then,
as the unprivileged sandbox uid, with git reading no user or system configuration and running no
hooks or fsmonitor: `git apply` the agent's patch, list every
changed path against the tree recorded at creation, restore each that is not project source
(`path_policy`, the same rule as bubblewrap grading) and the test files, apply the test patch.
The box then locks the tree and the grader's files (`lock`: handed to root, or bound read-only
where apptainer runs unprivileged), so the tests cannot write either, as the read-only bind does in
bubblewrap. The tests run through the grader's runner script (no current directory on ``sys.path``, plugin
autoload off, the image's installed ``pytest11`` plugins named, the grader's ini from the reset tree's
configuration), with `report_plugin` reading its configuration from stdin and writing its result stream to a
descriptor that is the exec's stdout, while pytest's own output goes to stderr. The stream is judged exactly
as in bubblewrap (`strict_run.judge_stream`: sequence, nonce, the grader's canaries written into the F2P
files, ids, counts), then against the gold patch's run in the same image (`grading.against_gold`), and every
tampering flag scores 0. `perturbed_in_box` is the perturbed second run of the F2P tests
(`strict_run.plan_perturbed`: renamed files and functions, the tree copied to ``/srv/<random>``, a random
``argv[0]``, no ``PYTEST_*`` visible); the box's host name stays the one it was created with. Everything of
the image's Python (the plugin listing, the runner) runs with the task environment activated the way its
dataset's harness does it (`tasks.datasets.Procedure.activate`: SWE-bench's images keep it in conda).
"""

from __future__ import annotations

import json
import secrets
import shlex
import tempfile
import time
from pathlib import Path

from polar_env.rewards import path_policy
from polar_env.rewards.canaries import CanaryPlan, plan_canaries
from polar_env.rewards.flags import tampering_flags
from polar_env.rewards.sandbox_exec import SandboxRun
from polar_env.rewards.strict_run import (
    CONFIG_FILES,
    PLUGIN_MODULE,
    PLUGIN_SRC,
    Perturbed,
    StrictOutcome,
    base_pytest_options,
    config_dirs,
    f2p_sources,
    judge_stream,
    plan_perturbed,
    pytest_args,
    render_ini,
    test_file_of,
    written_directives,
)
from polar_env.rewards.workspace import import_roots, path_budget_refusal
from polar_env.sandbox import safe_git
from polar_env.sandbox.apptainer import ApptainerBox
from polar_env.sandbox.container import BASE_FILE, GIT_DIR_INSIDE, ContainerSandbox
from polar_env.tasks.datasets import procedure_of
from polar_env.tasks.models import Task

GRADER_INSIDE = "/opt/polar-grader"
GIT = (
    "git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c diff.external= -c core.quotepath=false "
    "-c safe.directory='*'"
)
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0"}
MAX_STREAM_BYTES = 16 << 20
ROOT_STEP_S = 600.0  # the deadline of a grader step as root (a chown, a tree copy)
# the scripts below run in the task's tree, ``$POLAR_TREE`` (its workdir: /testbed, /app, /<repo>...)
CHANGES = f"""set -e
cd "$POLAR_TREE"
export GIT_ALTERNATE_OBJECT_DIRECTORIES={GIT_DIR_INSIDE}/objects  # the base snapshot's objects (container.py)
base=$(cat {BASE_FILE})
export GIT_INDEX_FILE=$(mktemp)
{GIT} read-tree "$base"
{GIT} add -A -f -- .
{GIT} diff --cached --name-only -z --no-renames "$base"
printf '\\0\\0'
{GIT} ls-tree -r --name-only -z "$base"
"""
SOURCE_DIFF = f"""cd "$POLAR_TREE"
export GIT_ALTERNATE_OBJECT_DIRECTORIES={GIT_DIR_INSIDE}/objects
base=$(cat {BASE_FILE})
export GIT_INDEX_FILE=$(mktemp)
{GIT} read-tree "$base" && {GIT} add -A -f -- . && \
{GIT} diff --cached --no-color --no-ext-diff "$base" -- "$@"
"""
RESTORE = f"""set -e
cd "$POLAR_TREE"
export GIT_ALTERNATE_OBJECT_DIRECTORIES={GIT_DIR_INSIDE}/objects  # the base snapshot's objects (container.py)
base=$(cat {BASE_FILE})
for p in "$@"; do
  # real parent directories (a link or file the agent put there is replaced): never rm through a link,
  # and the test patch's new files must be creatable whatever the agent made of their parents
  pre=; rest=$p
  while [ "${{rest#*/}}" != "$rest" ]; do
    pre=${{pre:+$pre/}}${{rest%%/*}}; rest=${{rest#*/}}
    if [ -L "$pre" ] || {{ [ -e "$pre" ] && [ ! -d "$pre" ]; }}; then rm -f -- "$pre"; fi
  done
  mkdir -p -- "$(dirname -- "$p")"
  rm -rf -- "$p"
  if {GIT} cat-file -e "$base:$p" 2>/dev/null; then {GIT} checkout "$base" -- "$p"; fi
done
{GIT} apply -v - || {{ echo 'POLAR: test patch did not apply'; exit 97; }}
# the final tree's links, as the kernel resolves them: one leaving the tree (not the base's own) is refused
find . -path ./.git -prune -o -type l -print0 | while IFS= read -r -d '' l; do
  case "$(realpath -m -- "$l")" in "$POLAR_TREE"|"$POLAR_TREE"/*) continue;; esac
  [ "$({GIT} cat-file blob "$base:${{l#./}}" 2>/dev/null)" = "$(readlink -- "$l")" ] && continue
  echo "POLAR: ${{l#./}}: symlink leaves the tree once the grader's reset is done"; exit 96
done
"""
# what the image's interpreter has installed, read without the tree on the path (-I: isolated)
PLUGINS = (
    'cd / && python -I -c "try:\n'
    "    import importlib.metadata as m\n"
    "    eps = m.entry_points()\n"
    "    eps = eps.select(group='pytest11') if hasattr(eps, 'select') else eps.get('pytest11', [])\n"
    "    names = {e.value.split(':')[0].strip() for e in eps}\n"
    "except ImportError:  # before Python 3.8\n"
    "    import pkg_resources\n"
    "    names = {e.module_name for e in pkg_resources.iter_entry_points('pytest11')}\n"
    "print(' '.join(sorted(names)))\""
)
CONFIGS = (  # argv: the tree, then its paths
    'cd / && python -I -c "import json, subprocess, sys\n'
    "out = {}\n"
    "for p in sys.argv[2:]:\n"
    "    r = subprocess.run(['cat', sys.argv[1] + '/' + p], capture_output=True)\n"
    "    if r.returncode == 0: out[p] = r.stdout.decode('utf-8', 'replace')\n"
    'print(json.dumps(out))" "$@"'
)


# a fresh box of the task's image: a container (podman, docker) or an apptainer box
ImageBox = ContainerSandbox | ApptainerBox


class StrictImageError(Exception):
    """The strict run could not be set up (an infrastructure or task fault, never the agent's)."""

    def __init__(self, message: str, task_defect: bool = False):
        super().__init__(message)
        self.task_defect = task_defect


class TestPatchFailed(StrictImageError):
    """The test patch did not apply: a task defect on the gold tree, the patch's doing on any other
    (the gold run shows it applies to the image's base)."""

    __test__ = False


def _config_candidates(directives: list[str]) -> list[str]:
    return [str(here / name) for here in config_dirs(directives) for name, _ in CONFIG_FILES]


async def _root(box: ImageBox, script: str) -> None:
    """A grader's step as root in the box (the tree and grader files handed to root, a copy made)."""
    ran = await box.run(["sh", "-c", script], user="0", timeout_s=ROOT_STEP_S)
    if ran.exit_code != 0:
        raise StrictImageError(
            f"a grader step as root failed ({'timed out' if ran.timed_out else ran.exit_code}): "
            f"{ran.stderr_tail[-500:]}"
        )


def _in_env(task: Task, script: str) -> list[str]:
    """``script`` as bash with the image's task environment active (its dataset's `Procedure.activate`)."""
    return ["bash", "-c", procedure_of(task).in_environment(script)]


async def _plugins(task: Task, box: ImageBox) -> list[str]:
    return (await box.run(_in_env(task, PLUGINS), timeout_s=60)).stdout_tail.split()


async def _fetch(task: Task, box: ImageBox, dest: Path, paths: list[str]) -> Path:
    """Copy the text of those of ``paths`` that exist in the task's tree to ``dest`` (host)."""
    got = await box.run(
        [*_in_env(task, CONFIGS), "bash", task.workdir, *paths],
        timeout_s=60,
        max_output_bytes=32 << 20,
    )
    dest.mkdir(parents=True, exist_ok=True)
    for rel, text in json.loads(got.stdout_tail or "{}").items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(text)
    return dest


async def _copy_texts(task: Task, box: ImageBox, staging: Path, texts: dict[str, str]) -> None:
    """Write each ``texts`` file (tree path -> text) over the task tree's."""
    for rel, text in texts.items():
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_text(text)
        await box.copy_in(staging / rel, f"{task.workdir}/{rel}")


async def _run_stream(
    task: Task, box: ImageBox, tree: str, grader: str, config: dict, timeout_s: float, canaries: CanaryPlan
) -> tuple[SandboxRun, StrictOutcome]:
    """Run the grader's script in ``grader`` on ``tree`` as the sandbox uid; judge its result stream."""
    exports = {k: v.replace("{testbed}", tree) for k, v in task.environment.env.items()}
    script = (
        f"cd {tree} && export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONNOUSERSITE=1 "
        f"POLAR_GRADER_CONFIG_FD=0 POLAR_GRADER_RESULT_FD=3 && exec 3>&1 1>&2 && "
        f"exec python {grader}/main.py"
    )
    t0 = time.monotonic()
    ran = await box.run(
        _in_env(task, script),
        env=exports,
        stdin=json.dumps(config).encode(),
        timeout_s=timeout_s,
        max_output_bytes=MAX_STREAM_BYTES,
    )
    run = SandboxRun(
        ran.exit_code if ran.exit_code is not None else -9,
        ran.stderr_tail,
        ran.timed_out,
        time.monotonic() - t0,
    )
    outcome = (
        StrictOutcome(error="timed out")
        if ran.timed_out
        else judge_stream(
            ran.stdout_tail.encode("utf-8", "surrogateescape"),
            ran.stdout_bytes,
            config,
            run,
            task.repo,
            tree_mount=tree,
            canaries=canaries,
        )
    )
    return run, outcome


async def perturbed_in_box(task: Task, box: ImageBox, timeout_s: float) -> Perturbed:
    """The perturbed F2P run in ``box``, after `strict_in_box` (the reset, test-patched tree is root's)."""
    with tempfile.TemporaryDirectory(prefix="polar-image-perturbed-") as tmp:
        f2p_files = sorted({test_file_of(t) for t in task.FAIL_TO_PASS if "::" in t})
        copy = await _fetch(task, box, Path(tmp) / "tests", f2p_files)
        cfg_tree = await _fetch(task, box, Path(tmp) / "cfg", _config_candidates(task.test_directives))
        try:
            plan = plan_perturbed(
                task, copy, cfg_tree, Path(tmp) / "grader", plugins=await _plugins(task, box)
            )
        except (ValueError, OSError, UnicodeDecodeError) as e:
            return Perturbed(StrictOutcome(violations=[f"perturbed-run: {e}"]), {})
        await box.provide(plan.mount)
        await box.provide(plan.grader_mount)
        await _root(
            box,
            f"mkdir -p {plan.mount} && cp -a {shlex.quote(task.workdir)}/. {plan.mount}/ && rm -f -- "
            + " ".join(f"{plan.mount}/{shlex.quote(old)}" for old in plan.files),
        )
        for new in plan.files.values():
            await box.copy_in(copy / new, f"{plan.mount}/{new}")
        await box.copy_in(Path(tmp) / "grader", plan.grader_mount)
        await box.lock([plan.mount, plan.grader_mount])
    run, outcome = await _run_stream(
        task, box, plan.mount, plan.grader_mount, plan.config, timeout_s, plan.canaries
    )
    return Perturbed(outcome, plan.renamed, run)


async def strict_in_box(task: Task, box: ImageBox, patch: str, timeout_s: float) -> dict:
    """Apply ``patch`` and run the tests the strict way in ``box`` (a fresh container of the image).

    Returns ``{"refused": git's words}``, or ``{"run": TestRun, "flags": {category: evidence},
    "reset_paths": {path: rule}}``; raises StrictImageError when the run cannot be set up.
    """
    from polar_env.rewards.grading import TestRun

    tree = task.workdir
    env = {**GIT_ENV, "POLAR_TREE": tree}
    # the patch's .gitattributes cannot break git add
    await _root(box, safe_git.shell_neutralise(f"{tree}/.git"))
    if patch.strip():
        applied = await box.run(
            ["sh", "-c", f'cd "$POLAR_TREE" && {GIT} apply --verbose -'],
            env=env,
            stdin=patch.encode("utf-8", "surrogateescape"),
            timeout_s=120,
        )
        if applied.exit_code != 0:
            return {"refused": (applied.stdout_tail + applied.stderr_tail)[-4000:]}
    listed = await box.run(["bash", "-c", CHANGES], env=env, timeout_s=300, max_output_bytes=64 << 20)
    if listed.exit_code != 0:
        raise StrictImageError(f"listing changes failed: {listed.stderr_tail[-500:]}")
    changed_s, _, files_s = listed.stdout_tail.partition("\0\0")
    changed = [p for p in changed_s.split("\0") if p]
    if too_many := path_budget_refusal(changed):  # they become exec arguments below
        return {"refused": too_many}
    files = [p for p in files_s.split("\0") if p]
    roots = import_roots(task, files)
    reset = {p: r for p in changed if (r := path_policy.non_source_reason(p, roots))}
    kept = [p for p in changed if p not in reset]
    flags: dict[str, str] = {}
    if kept:
        diff = await box.run(
            ["bash", "-c", SOURCE_DIFF, "bash", *kept], env=env, timeout_s=300, max_output_bytes=16 << 20
        )
        flags = tampering_flags(diff.stdout_tail, task.repo, task.problem_statement)
    paths = sorted(dict.fromkeys([*task.test_files(), *reset]), key=lambda p: (p.count("/"), p))
    restored = await box.run(
        ["bash", "-c", RESTORE, "bash", *paths],
        env=env,
        timeout_s=300,
        stdin=task.test_patch.encode("utf-8", "surrogateescape"),
    )
    if restored.exit_code == 96:
        return {"refused": restored.stdout_tail[-2000:]}
    if restored.exit_code == 97:
        raise TestPatchFailed(
            f"test patch did not apply cleanly:\n{restored.stdout_tail[-2000:]}", task_defect=True
        )
    if restored.exit_code != 0:
        raise StrictImageError(f"reset failed: {restored.stderr_tail[-500:]}")
    plugins = await _plugins(task, box)
    with tempfile.TemporaryDirectory(prefix="polar-image-strict-") as tmp:
        cfg_tree = await _fetch(task, box, Path(tmp) / "cfg", _config_candidates(task.test_directives))
        f2p = await _fetch(
            task, box, Path(tmp) / "f2p", sorted({test_file_of(t) for t in task.FAIL_TO_PASS if "::" in t})
        )
        originals = f2p_sources(
            task.FAIL_TO_PASS, lambda rel: (f2p / rel).read_bytes() if (f2p / rel).is_file() else None
        )
        canaries = plan_canaries(originals, task.FAIL_TO_PASS)
        grader = Path(tmp) / "grader"
        grader.mkdir()
        (grader / f"{PLUGIN_MODULE}.py").write_text(PLUGIN_SRC.read_text())
        (grader / "pytest.ini").write_text(render_ini(base_pytest_options(cfg_tree, task.test_directives)))
        options = [
            "-c",
            f"{GRADER_INSIDE}/pytest.ini",
            f"--rootdir={tree}",
            f"--confcutdir={tree}",
            "-p",
            "no:cacheprovider",
            "-p",
            PLUGIN_MODULE,
            *[x for m in plugins for x in ("-p", m)],
            *pytest_args(task),
            *written_directives(canaries, task.test_directives),
        ]
        (grader / "main.py").write_text(f"import pytest\nraise SystemExit(pytest.main({options!r}))\n")
        await box.provide(GRADER_INSIDE)
        await box.copy_in(grader, GRADER_INSIDE)
        await _copy_texts(task, box, Path(tmp) / "canaries", canaries.files)
        await box.lock([GRADER_INSIDE, tree])
        config = {"nonce": secrets.token_hex(16)}
        run, outcome = await _run_stream(task, box, tree, GRADER_INSIDE, config, timeout_s, canaries)
        await _copy_texts(task, box, Path(tmp) / "originals", {rel: originals[rel] for rel in canaries.files})
        await box.lock([tree])
    out = TestRun(
        timed_out=run.timed_out,
        log=run.output,
        seconds=run.seconds,
        status_map=outcome.status_map,
        valid=outcome.valid,
        collected=outcome.collected,
        violations=outcome.violations,
        error=outcome.error or "; ".join(outcome.violations),
        untrusted_xfail=outcome.untrusted_xfail,
        runner=outcome.runner,
    )
    return {"run": out, "flags": flags, "reset_paths": reset}

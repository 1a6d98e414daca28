"""Repository history reduced to the base, end to end in podman (sandbox/history.py): a locally built
image of a bundled task and a Harbor folder whose repositories hold the fix in a later commit, a branch,
tags, a remote, notes, a stash, reflog entries, an unreachable commit, FETCH_HEAD and ORIG_HEAD, and a
nested clone holding it on its remote branch (each checked first, straight from the image: the control;
the Harbor task keeps its nested repository, which may be its puzzle). In a real Pi episode, the
agent's own `git log --all`, `git reflog`, `git stash list`, `git fsck --lost-found` and `git cat-file
--batch-all-objects` show the base only, the gold patch still earns 1.0, and the episode is reported as
history mining by `polar check` and the viewer. The same through the apptainer stand-in
(tests/apptainer_standin.py). A task whose history cannot be reduced is refused in one line."""

from __future__ import annotations

import re
import secrets
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from dataset_standins import build_layer
from proxy_client import make_proxy

from polar_env.backends.scripted import ScriptedBackend
from polar_env.episodes import EpisodeSettings, run_episode
from polar_env.episodes.workspace import engine_available, open_workspace
from polar_env.harness_adapters.policies import final_answer, patch_edit, shell_call
from polar_env.outcomes import FailureKind
from polar_env.proxy.app import ProxyServer
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.container import HistoryNotReduced, image_exists
from polar_env.sandbox.warm_images import warm_image_name
from polar_env.tasks.harbor import gold_command, load_task_dir
from polar_env.tasks.harbor_image import ensure_harbor_image
from polar_env.tasks.images import ensure_task_image
from polar_env.tasks.loader import TERMINAL_DIR, load_bundled
from polar_env.tasks.models import Task
from polar_env.tasks.runtime import container_spec, history_target, task_spec
from polar_env.trajectory.export import TrajectoryWriter
from polar_env.trajectory.models import Trajectory

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not engine_available("podman"), reason="needs podman (scripts/setup_podman.sh)"),
]
ENGINE = "podman"
TASK_ID = "psf__requests-5414"
# Run as root in the image build, in the task's workdir: a repository (made here if the workdir has none)
# holding the fix (`apply` makes it) every way a repository can, left checked out at its base.
MAKE_HISTORY = r"""set -eu
g() { git -c user.name=dev -c user.email=dev@example.com "$@"; }
if [ ! -d .git ]; then
  git init -q -b main && g add -A &&
    GIT_COMMITTER_DATE=2020-01-01T00:00:00Z g commit -q --date=2020-01-01T00:00:00Z -m base
fi
export GIT_AUTHOR_DATE=2030-01-01T00:00:00Z GIT_COMMITTER_DATE=2030-01-01T00:00:00Z
base=$(git rev-parse HEAD); branch=$(git symbolic-ref --short HEAD)
g checkout -qb fix && bash /tmp/layer/apply && g add -A && g commit -qm "the fix"
g tag v-fixed && g tag -a v9.9 -m "the release with the fix" && g notes add -m "fixed here" fix
g checkout -q "$branch"
g remote add origin https://github.com/example/upstream && g update-ref refs/remotes/origin/fix fix
printf '%s\tbranch fix of https://github.com/example/upstream\n' "$(git rev-parse fix)" > .git/FETCH_HEAD
bash /tmp/layer/apply && g stash -q
bash /tmp/layer/apply && g commit -qam "unreachable, in the reflog only" && g reset -q --hard "$base"
g pack-refs --all
[ "$(git rev-parse HEAD)" = "$base" ] && [ -z "$(git status --porcelain --untracked-files=no)" ]
git clone -q --no-local . vendor-clone  # a nested clone: the fix on its remote branch and tags
"""
CONTROL = "git log --all --oneline | wc -l; git stash list | wc -l; git reflog | wc -l; git tag | wc -l"


def probe(workdir: str, needle: str) -> str:
    """What a history-mining agent runs: each listing between markers, and a count of the objects holding
    ``needle`` (a line of the fix)."""
    return (
        f"cd {shlex.quote(workdir)} && echo ==log && git log --all --format='%H %s' && echo ==reflog && "
        "git reflog && echo ==stash && git stash list && echo ==fsck && git fsck --lost-found 2>&1; "
        "echo ==objects && git cat-file --batch-all-objects --batch-check='%(objecttype) %(objectname)' "
        "| grep '^commit'; echo ==fix && { git cat-file --batch-all-objects --batch | grep -c -F "
        f"{shlex.quote(needle)}; }}; echo ==refs && git for-each-ref --format='%(refname)'; echo ==nested && "
        "git -C vendor-clone log --all --format='%H %s'; echo ==end"
    )


def sections(output: str) -> dict[str, list[str]]:
    found = re.search(r"==log\n(.*)==end", output, re.S)
    assert found, output[-2000:]
    parts = re.split(r"^==(\w+)$", "==log\n" + found.group(1), flags=re.M)[1:]
    return {
        name: [line for line in body.splitlines() if line.strip()]
        for name, body in zip(parts[::2], parts[1::2], strict=True)
    }


def probe_then_gold(task: Task, needle: str):
    """The probe through the harness's shell tool, then the gold fix, then a final answer."""

    def policy(session_id: str | None, call_number: int, prompt_text: str) -> str:
        done = prompt_text.count("<tool_response>")
        if done == 0:
            return shell_call(prompt_text, probe(task.workdir, needle))
        if done == 1:
            return (
                shell_call(prompt_text, gold_command(task))
                if task.harbor
                else patch_edit(prompt_text, task.patch)
            )
        return final_answer(prompt_text)

    return policy


def added_line(patch: str) -> str:
    return next(
        line[1:].strip()
        for line in patch.splitlines()
        if line.startswith("+") and not line.startswith("+++") and len(line.strip()) > 20
    )


def with_history(base_image: str, name: str, workdir: str, apply: str) -> str:
    """``base_image`` with `MAKE_HISTORY` run in ``workdir``, built once (tagged by its inputs)."""
    return build_layer(
        ENGINE,
        base_image,
        f"polar-test-history/{name}",
        {"make.sh": MAKE_HISTORY, "apply": apply},
        f"cd {shlex.quote(workdir)} && sh /tmp/layer/make.sh",
    )


def control(image: str, workdir: str) -> list[int]:
    """The image's own repository, read with nothing of Polar: commits, stashes, reflog entries, tags."""
    out = subprocess.run(
        [ENGINE, "run", "--rm", "--network", "none", "-w", workdir, image, "sh", "-c", CONTROL],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return [int(n) for n in out.split()]


@pytest.fixture(scope="module")
def swe_task() -> Task:
    """The bundled requests task in an image whose /testbed repository holds its fix every way history can."""
    task = next(t for t in load_bundled() if t.instance_id == TASK_ID)
    task = task.model_copy(update={"image": ensure_task_image(task, ENGINE), "base_archive": None})
    gold = task.patch
    image = with_history(task.image, TASK_ID.lower(), "/testbed", f"git apply <<'EOF'\n{gold}EOF\n")
    return task.model_copy(update={"image": image})


@pytest.fixture(scope="module")
def harbor_task(tmp_path_factory) -> Task:
    """A Harbor folder (the shipped fix-median-bug) whose /app becomes a repository holding its fix the same
    way."""
    folder = tmp_path_factory.mktemp("harbor") / "fix-median-bug-history"
    shutil.copytree(TERMINAL_DIR / "fix-median-bug", folder)
    (folder / "task.toml").write_text(
        (folder / "task.toml")
        .read_text()
        .replace('name = "polar/fix-median-bug"', 'name = "polar/fix-median-bug-history"')
    )
    env = folder / "environment"
    (env / "history").mkdir()
    (env / "history" / "make.sh").write_text(MAKE_HISTORY)
    shutil.copy(folder / "solution" / "solve.sh", env / "history" / "apply")
    with open(env / "Dockerfile", "a") as dockerfile:
        dockerfile.write(
            "COPY history /tmp/layer\nRUN cd /app && sh /tmp/layer/make.sh && rm -rf /tmp/layer\n"
        )
    return load_task_dir(folder)


@pytest.fixture
async def proxy_for(local_backend, renderer, tmp_path: Path):
    """A proxy whose turns a given policy writes, scored by the real model."""
    made: list[tuple[ProxyServer, Path]] = []

    async def make(policy) -> ProxyServer:
        backend = ScriptedBackend(local_backend, policy, context_window=256)
        proxy = make_proxy(
            renderer,
            backend,
            tmp_path / f"ledger{len(made)}",
            admin_secret=secrets.token_urlsafe(16),
            max_context=32768,
        )
        sock = Path(f"/tmp/polar-t-{uuid.uuid4().hex[:8]}")
        sock.mkdir(mode=0o755)
        await proxy.start(unix_socket=sock / "proxy.sock", port=None)
        made.append((proxy, sock))
        return proxy

    yield make
    for proxy, sock in made:
        await proxy.stop()
        shutil.rmtree(sock, ignore_errors=True)


def tool_output(traj: Trajectory) -> str:
    return next(
        m.content for c in traj.calls for m in c.new_messages if m.role == "tool" and "==log" in m.content
    )


def assert_base_only(found: dict[str, list[str]], base: str, branch: str) -> None:
    assert found["log"] == [f"{base} base"], found["log"]
    assert found["reflog"] == [] and found["stash"] == [], found
    assert not [line for line in found["fsck"] if "dangling" in line or "unreachable" in line], found["fsck"]
    assert found["objects"] == [f"commit {base}"] and found["fix"] == ["0"], found
    assert found["refs"] == [f"refs/heads/{branch}"], found["refs"]


async def mine_then_fix(task: Task, needle: str, proxy_for, sandbox: str, tmp_path: Path) -> Trajectory:
    """A real Pi episode in ``sandbox`` that mines the history, then applies the gold fix: what it saw is
    the base only, and the fix earns 1.0."""
    proxy = await proxy_for(probe_then_gold(task, needle))
    result = await run_episode(
        proxy,
        task,
        episode_id=f"{task.instance_id}.s0.a0",
        settings=EpisodeSettings(harness="pi", sandbox=sandbox, timeout=300),
        scratch_root=tmp_path,
    )
    traj = result.trajectory
    assert traj.status == "completed", (traj.error, result.harness and result.harness.stderr_tail[-2000:])
    base = subprocess.run(
        [
            ENGINE,
            "run",
            "--rm",
            "--network",
            "none",
            "-w",
            task.workdir,
            task.image or "",
            "git",
            "rev-parse",
            "HEAD",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    found = sections(tool_output(traj))
    assert_base_only(found, base, "main")
    if task.harbor is None:  # a nested repository is reduced to its own HEAD too
        assert found["nested"] == [f"{base} base"], found["nested"]
    else:  # but a Harbor task's, which may be the puzzle, stays as it is (the control)
        assert f"{base} base" in found["nested"] and any(
            line.endswith(" the fix") for line in found["nested"]
        ), found["nested"]
    assert traj.reward == 1.0 and traj.failure_kind == "none", traj.grading
    assert "history_mining" in traj.metadata.exploit_attempts, traj.metadata
    return traj


async def test_a_history_mining_pi_episode_sees_the_base_only_and_gold_still_earns_one(
    swe_task: Task, harbor_task: Task, proxy_for, tmp_path: Path
):
    harbor_task.image = ensure_harbor_image(harbor_task, ENGINE)
    for task in (swe_task, harbor_task):
        commits, stashes, reflog, tags = control(task.image or "", task.workdir)
        assert commits >= 4 and stashes == 1 and reflog >= 5 and tags == 2, (
            task.image,
            commits,
            stashes,
            reflog,
            tags,
        )
    episodes = [
        await mine_then_fix(swe_task, added_line(swe_task.patch), proxy_for, ENGINE, tmp_path),
        await mine_then_fix(
            harbor_task, "return (ordered[n // 2 - 1] + ordered[n // 2]) / 2", proxy_for, ENGINE, tmp_path
        ),
    ]
    run = tmp_path / "run"
    run.mkdir()
    with TrajectoryWriter(run / "trajectories.jsonl") as writer:
        for traj in episodes:
            writer.write(traj)
    polar = [sys.executable, "-m", "polar_env.cli"]
    check = subprocess.run([*polar, "check", str(run)], capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and "EXPLOIT ATTEMPTS" in check.stdout, check.stdout + check.stderr
    assert "history_mining: 2 of 2 episode(s) (100.0%)" in check.stdout, check.stdout
    view = subprocess.run(
        [*polar, "view", str(run), "--out", str(tmp_path / "page.html")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert view.returncode == 0, view.stderr
    page = (tmp_path / "page.html").read_text()
    assert '"exploits":["history_mining"]' in page and "Exploit attempts" in page


async def test_the_same_through_the_apptainer_standin(
    swe_task: Task, proxy_for, tmp_path: Path, apptainer_log: Path
):
    """apptainer cannot be installed here: ``apptainer`` on PATH is a stand-in that runs each exec as a
    ``podman run`` of the same image (tests/apptainer_standin.py). The image's tree, copied out to the
    host, is reduced inside the image (the stand-in's log shows it), and the same Pi episode sees the base
    only; its gold patch, graded in the image's apptainer box, earns 1.0."""
    log = apptainer_log
    traj = await mine_then_fix(swe_task, added_line(swe_task.patch), proxy_for, "apptainer", tmp_path)
    assert traj.metadata.workspace == "apptainer"
    calls = [line for line in log.read_text().splitlines() if line.startswith("exec ")]
    assert (
        sum(c.endswith("/bin/sh -c set -u") for c in calls) == 1
    )  # reduced once, for the episode and its grading


async def test_a_task_whose_history_cannot_be_reduced_is_refused_in_one_line(swe_task: Task, tmp_path: Path):
    """A base that is not a commit of the image's repository: the workspace is refused (a task defect, one
    line naming the image and why) and no warm image is committed."""
    task = swe_task.model_copy(update={"base_commit": "0" * 40})
    with pytest.raises(HistoryNotReduced) as refused:
        await open_workspace(task, SandboxSpec(scratch_root=tmp_path), sandbox=ENGINE)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(
        f"{task.image} /testbed: its git history cannot be reduced"
    )
    assert message.endswith(f"the base {'0' * 40} is not a commit of the repository at /testbed")
    assert refused.value.failure_kind == FailureKind.task_defect
    spec = container_spec(task, task_spec(task, SandboxSpec()), ENGINE)
    assert not image_exists(ENGINE, warm_image_name(ENGINE, task.image or "", spec, history_target(task)))


async def test_polar_tasks_audit_reads_the_repository_as_the_agent(swe_task: Task, harbor_task: Task):
    """``polar tasks audit``'s workspace checks (cli/tasks_audit.py): on each image whose repository holds
    the fix in later history, the repository read as the agent shows the base only (``resists``), and no
    view holds the gold patch's lines; the same probe straight on the image, with nothing of Polar, finds
    the commits beyond the base (the control: ``controls``)."""
    from polar_env.cli.tasks_audit import HISTORY_PROBE, history_verdict, workspace_checks

    harbor_task.image = ensure_harbor_image(harbor_task, ENGINE)
    for task in (swe_task, harbor_task):
        checks = await workspace_checks(task, ENGINE)
        assert checks["repository-history"].verdict == "resists", checks
        assert checks["answer-readable"].verdict == ("resists" if task.patch else "not_applicable"), checks
        raw = subprocess.run(
            [ENGINE, "run", "--rm", "--network", "none", task.image or "", "bash", "-c", HISTORY_PROBE]
            + ["probe", task.workdir],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        control = history_verdict(raw.stdout)
        assert control.verdict == "controls" and "beyond the base" in control.detail, control

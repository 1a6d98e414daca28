"""Failures cannot hide, and grading runs under limits (issue 25, part A).

Masking is decided by the supervisor, never by the tested process's output: a patch that prints
``bwrap: ...`` and exits at import is the patch's crash (0), not infrastructure; a patched tree
that stops the grading sandbox from starting while the base's starts is ``patch_broke_sandbox``
(0, trained). Grading-time fork bombs, memory hogs and disk fillers (as patches) end at their
limit (small limits here, set through ``POLAR_GRADING_*``) with reward 0 and the host unaffected.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polar_env.outcomes import OutcomeTable
from polar_env.rewards import sandbox_exec
from polar_env.rewards.grading import FailureKind, GradingMode, grade
from polar_env.rewards.patch import tree_patch
from polar_env.rewards.sandbox_exec import GradingLimits, run_sandboxed
from polar_env.sandbox.cgroups import CgroupLimits
from polar_env.tasks.env import ensure_task_env
from polar_env.tasks.loader import load_tasks
from polar_env.tasks.tree import materialize

pytestmark = pytest.mark.needs("bwrap")

TASK = next(t for t in load_tasks("bundled") if t.instance_id == "pallets__flask-5014")
INIT = "src/flask/__init__.py"


@pytest.fixture(scope="module")
def venv() -> Path:
    return ensure_task_env(TASK)


def patch_with(tmp: Path, code: str, *, extra: dict[str, bytes] | None = None) -> str:
    """A patch that runs ``code`` when flask is imported (every test imports it), plus extra files."""
    tree = materialize(TASK, tmp / "agent")
    (tree / INIT).write_text(code + "\n" + (tree / INIT).read_text())
    for rel, data in (extra or {}).items():
        (tree / rel).write_bytes(data)
    return tree_patch(tree)


def assert_zero_unmasked(result, kind: FailureKind | None = None) -> None:
    assert result.reward == 0.0 and not result.resolved
    assert not result.failure_kind.outside_policy, (result.failure_kind, result.error)
    assert OutcomeTable().apply(result.failure_kind, result.reward) == (0.0, False)
    if kind is not None:
        assert result.failure_kind is kind, (result.failure_kind, result.error)


def test_forged_sandbox_error_then_exit_is_the_patchs_crash(tmp_path: Path):
    patch = patch_with(
        tmp_path,
        "import os, sys\nprint('bwrap: Can\\'t mount proc on /newroot/proc', "
        "file=sys.stderr, flush=True)\nos._exit(1)",
    )
    result = grade(TASK, patch)
    assert_zero_unmasked(result, FailureKind.test_crash)
    assert all(m.failure_kind is FailureKind.test_crash for m in result.modes.values())


def test_a_start_that_fails_on_the_base_too_is_infrastructure(tmp_path: Path, venv: Path):
    """The control: a sandbox that cannot start at all (a mount source missing) is not the tree's."""
    from polar_env.sandbox.bwrap_argv import Mount

    run = run_sandboxed(
        ["true"],
        tree=tmp_path,
        venv=venv,
        timeout_s=30,
        extra_mounts=[Mount("/opt/missing", tmp_path / "does-not-exist")],
    )
    assert not run.started and run.returncode != 0


def test_a_tree_that_breaks_sandbox_start_is_patch_broke_sandbox(tmp_path: Path, monkeypatch):
    """A writable run copies the tree into a sized tmpfs before it reports its start: a patched tree
    that does not fit stops the start, the base's fits: 0 for the patch, not masked."""
    base_bytes = sum(
        f.stat().st_size
        for f in materialize(TASK, tmp_path / "base").rglob("*")
        if f.is_file() and ".git" not in f.parts
    )
    monkeypatch.setenv("POLAR_GRADING_TMPFS_BYTES", str(base_bytes + (4 << 20)))
    patch = patch_with(tmp_path, "", extra={"src/flask/blob.txt": b"x\n" * (4 << 20)})
    result = grade(TASK, patch, mode=GradingMode.swebench)
    assert_zero_unmasked(result, FailureKind.patch_broke_sandbox)
    assert "did not start" in result.error


class _RunGroups(CgroupLimits):
    """Every grading run's cgroups, as sandbox_exec makes them: each group's pids peak and limit-hit
    count read before it is removed, and whether any process was still in it after the removal."""

    made: list[_RunGroups] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pids_seen: tuple[int, int] | None = None  # (pids.peak, times a fork hit pids.max)
        self.left: list[str] = []
        _RunGroups.made.append(self)

    def remove(self) -> None:
        group = self.groups.get("pids")
        if group is not None:
            events = dict(line.split() for line in (group / "pids.events").read_text().splitlines())
            peak = group / "pids.peak"
            self.pids_seen = (int(peak.read_text()) if peak.exists() else -1, int(events.get("max", 0)))
        dirs = list(self.dirs)
        super().remove()
        self.left = [pid for d in dirs if d.exists() for pid in (d / "cgroup.procs").read_text().split()]


def _descendants(root: int) -> set[int]:
    """The live processes under ``root`` (this test's own: the other pytest job's are not counted)."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


@pytest.mark.slow
def test_grading_fork_bomb_ends_at_the_pids_limit(tmp_path: Path, monkeypatch):
    """Scoped to the grading runs (their cgroups, this process's descendants), not the whole host, which
    the other pytest job shares: every run was limited by its pids group, the bomb reached that limit
    and stayed under it, and nothing of it is left running, in its group or under this process."""
    probe = CgroupLimits(f"probe-{os.getpid()}", None, 64)
    probe.remove()
    if "pids" not in probe.versions:
        pytest.skip(f"no pids cgroup here: {probe.skipped.get('pids')}")
    monkeypatch.setenv("POLAR_GRADING_PIDS_MAX", "64")
    monkeypatch.setattr(sandbox_exec, "CgroupLimits", _RunGroups)
    monkeypatch.setattr(_RunGroups, "made", [])
    patch = patch_with(
        tmp_path, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    )
    before = _descendants(os.getpid())
    t0 = time.monotonic()
    result = grade(TASK, patch, timeout_s=8)
    assert time.monotonic() - t0 < 180  # two loaded cores
    assert_zero_unmasked(result)
    assert result.failure_kind in (FailureKind.test_timeout, FailureKind.test_crash)
    runs = _RunGroups.made
    assert runs and all(r.versions.get("pids") for r in runs), [(r.versions, r.skipped) for r in runs]
    assert all(r.left == [] for r in runs), [r.left for r in runs]  # nothing of it is left running
    seen = [r.pids_seen for r in runs]
    assert all(s is not None and s[0] <= 64 for s in seen), seen  # never above the limit
    assert any(s[1] > 0 for s in seen), seen  # the bomb did reach it: forks were refused
    assert _descendants(os.getpid()) <= before
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork


@pytest.mark.slow
def test_grading_memory_hog_ends_at_the_memory_limit(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("POLAR_GRADING_MEMORY_BYTES", str(256 << 20))
    patch = patch_with(tmp_path, "blocks = []\nwhile len(blocks) < 64:\n    blocks.append(b'x' * (64 << 20))")
    t0 = time.monotonic()
    result = grade(TASK, patch, timeout_s=60)
    assert time.monotonic() - t0 < 120
    assert_zero_unmasked(result, FailureKind.test_crash)  # killed at 256 MiB, not at 4 GiB


def _disk_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def _spy_host_writes(monkeypatch) -> list[int]:
    """Per sandbox run of a grade, how many bytes the host paths it was given (tree, bind mounts) grew
    by, measured around the run (the host's free disk is shared with the other pytest job)."""
    grown: list[int] = []
    real = sandbox_exec.run_sandboxed

    def spy(script, *, tree: Path, extra_mounts=(), **kwargs):
        paths = [
            Path(tree),
            *(Path(m.src) for m in extra_mounts if m.src is not None and Path(m.src).is_dir()),
        ]
        before = sum(_disk_bytes(p) for p in paths)
        try:
            return real(script, tree=tree, extra_mounts=extra_mounts, **kwargs)
        finally:
            grown.append(sum(_disk_bytes(p) for p in paths) - before)

    for module in list(sys.modules.values()):
        if (
            getattr(module, "__name__", "").startswith("polar_env.")
            and getattr(module, "run_sandboxed", None) is real
        ):
            monkeypatch.setattr(module, "run_sandboxed", spy)
    return grown


@pytest.mark.slow
def test_grading_disk_filler_ends_at_the_tmpfs_limit(tmp_path: Path, monkeypatch):
    """Fill /tmp, HOME and the tree (1 GiB each asked): each is a 32 MiB tmpfs, the host disk is untouched."""
    monkeypatch.setenv("POLAR_GRADING_TMPFS_BYTES", str(32 << 20))
    filler = (
        "import os\nfor d in ('/tmp', os.path.expanduser('~'), os.getcwd()):\n"
        "    try:\n        with open(os.path.join(d, 'fill.bin'), 'wb') as f:\n"
        "            for _ in range(1024):\n                f.write(b'\\0' * (1 << 20))\n"
        "    except OSError as e:\n        print('filler stopped:', d, e)\n"
        "raise SystemExit('filled')"
    )
    patch = patch_with(tmp_path, filler)
    grown = _spy_host_writes(monkeypatch)
    result = grade(TASK, patch, timeout_s=60)
    assert_zero_unmasked(result)
    # 3 GiB asked: the host paths each run was given (its tree, its bound grader dirs) did not take it
    assert grown and max(grown) < 32 << 20, grown
    assert "No space left on device" in result.log_tail or "Read-only file system" in result.log_tail


def test_limits_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("POLAR_GRADING_MEMORY_BYTES", "0")
    monkeypatch.setenv("POLAR_GRADING_PIDS_MAX", "77")
    limits = GradingLimits.from_env()
    assert (
        limits.memory_bytes is None
        and limits.pids_max == 77
        and limits.tmpfs_bytes == GradingLimits().tmpfs_bytes
    )


def test_sandbox_run_reports_its_limits_and_start(tmp_path: Path, venv: Path):
    run = run_sandboxed(
        "cat /proc/self/status | grep -c . ; df -B1 --output=size /tmp | tail -1",
        tree=tmp_path,
        venv=venv,
        timeout_s=30,
        tree_writable=False,
        limits=GradingLimits(memory_bytes=1 << 30, pids_max=100, tmpfs_bytes=8 << 20),
    )
    assert run.started and run.returncode == 0, run.output
    assert int(run.output.split()[-1]) == 8 << 20
    assert set(run.limits) == {"memory", "pids"}


def test_non_utf8_file_names_never_make_a_record_unwritable(tmp_path: Path):
    """A test file and a source file with undecodable names: graded (the source one kept, the test one
    reset), and the grade, a trajectory carrying it and the Gym verify outcome all serialise."""
    from polar_env.rewards.patch import ApplyMethod, apply_patch
    from polar_env.trajectory.export import TrajectoryWriter
    from polar_env.trajectory.models import Trajectory, TrajectoryStats

    tree = materialize(TASK, tmp_path / "agent")
    assert apply_patch(tree, TASK.patch)[0] == ApplyMethod.git_apply
    (tree / "tests").joinpath(os.fsdecode(b"test_\xff.py")).write_text("def test_x():\n    assert False\n")
    (tree / "src" / "flask").joinpath(os.fsdecode(b"caf\xe9.txt")).write_text("data\n")
    patch = tree_patch(tree)
    result = grade(TASK, patch)
    assert result.resolved and result.reward == 1.0, result.error
    assert list(result.reset_paths) == [os.fsdecode(b"tests/test_\xff.py")]  # kept exact for the reset itself
    dumped = result.model_dump_json()
    assert "tests/test_\\\\xff.py" in dumped
    stats = TrajectoryStats(
        calls=0,
        failed_calls=0,
        chains=0,
        sampled_tokens=0,
        trainable_tokens=0,
        trainable_fraction=0.0,
        main_chain_tokens=0,
        masked_tokens=0,
        unscored_tokens=0,
    )
    traj = Trajectory(
        session_id="s",
        created_at=0.0,
        status="completed",
        stats=stats,
        reward=1.0,
        grading=result.model_dump(),
        metadata={"patch": patch},
        error=os.fsdecode(b"\xfe"),
    )
    with TrajectoryWriter(tmp_path / "t.jsonl") as writer:
        writer.write(traj)
    back = Trajectory.model_validate_json((tmp_path / "t.jsonl").read_bytes())
    assert back.reward == 1.0 and back.error == "\\xfe" and "caf\\xe9.txt" in back.metadata.patch


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm for the harness")
async def test_a_harness_the_agent_kills_or_outsleeps_is_graded(embedded_dir: Path, renderer, tmp_path: Path):
    """Pi in bubblewrap, a scripted policy whose one command edits the tree and then kills every
    process of the sandbox user (the harness too) or sleeps past the deadline: the patch on disk is
    graded, a wrong one 0 and trained, the gold one 1.0; the trajectory is written (its non-UTF-8
    file name too)."""
    import base64

    from reliability_helpers import scripted_proxy

    from polar_env.episodes import EpisodeSettings, run_episode
    from polar_env.harness_adapters.policies import DONE, shell_call
    from polar_env.trajectory.export import TrajectoryWriter

    gold = base64.b64encode(TASK.patch.encode()).decode()
    commands = {
        "kill": "cd /testbed && echo '# not a fix' >> src/flask/blueprints.py "
        "&& touch $'src/flask/\\xff.txt' && kill -KILL -1",
        "sleep": f"cd /testbed && echo {gold} | base64 -d | git apply && sleep 600",
    }

    def policy(session_id: str | None, call_number: int, prompt_text: str) -> str:
        probe = (session_id or "").split(".")[0]
        return DONE if "<tool_response>" in prompt_text else shell_call(prompt_text, commands[probe])

    results = {}
    async with scripted_proxy(embedded_dir, renderer, policy, tmp_path) as proxy:
        for probe, timeout_s in (
            ("kill", 240),
            ("sleep", 150),
        ):  # the first call can be slow on a loaded host
            results[probe] = await run_episode(
                proxy,
                TASK,
                episode_id=f"{probe}.s0",
                settings=EpisodeSettings(
                    harness="pi",
                    timeout=timeout_s,
                    max_tokens=4096,
                ),
                scratch_root=tmp_path / "scratch",
            )
    killed, slept = results["kill"], results["sleep"]
    # SIGKILL seen as bwrap's exit 137 (harness_crashed) or as the signal itself (harness_killed): either is
    # graded
    assert killed.harness.status == "error" and killed.harness.exit_code in (137, None), (
        killed.trajectory.error
    )
    assert killed.failure_kind in (FailureKind.harness_killed, FailureKind.harness_crashed)
    assert not killed.trajectory.masked and killed.trajectory.reward == 0.0
    assert killed.grade is not None and killed.grade.failure_kind is FailureKind.none, killed.grade.error
    assert "# not a fix" in killed.patch and os.fsdecode(b"src/flask/\xff.txt") in killed.patch
    assert slept.harness.status == "timeout"
    assert slept.grade is not None and slept.grade.resolved
    assert (
        slept.failure_kind is FailureKind.none
        and slept.trajectory.reward == 1.0
        and not slept.trajectory.masked
    )
    with TrajectoryWriter(tmp_path / "t.jsonl") as writer:
        for r in results.values():
            writer.write(r.trajectory)
    assert len((tmp_path / "t.jsonl").read_bytes().splitlines()) == 2

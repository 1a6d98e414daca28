"""The Harbor verifier contract: a task's own ``tests/test.sh`` decides its reward, in the agent's container.

Harbor (and NeMo Gym, which runs Harbor folders natively) grade a task after the agent is done, in
the environment the agent left: the agent never saw ``tests/`` or ``solution/`` (neither is in the
image: it is built from ``environment/`` only, and nothing of the task folder is mounted). Here,
once the harness has ended:

1. every process in the container but its init and keep-alive is killed, from the host (no program
   of the container runs: a root agent owns them all), so nothing the agent left running writes later;
2. the verifier's paths are **host directories** the engine bound in when the container was made
   (``VERIFIER_HOST_DIRS``, sandbox/container.py ``host_dirs``): root's on the host, so no uid of the
   container could read ``/tests`` or write ``/logs/verifier`` during the agent's run (in the
   container's user namespace not even its root: the host's root is no uid there). The host now
   empties them, copies ``tests/`` in (read-only for every uid of the container) and hands
   ``/logs/verifier`` and a fresh HOME to the verifier's user;
3. ``bash /tests/test.sh`` runs in the workdir as ``[verifier] user``, else as the agent's user (as
   Harbor: the image's; root where the image is root), with ``[verifier] env``, under ``[verifier]
   timeout_sec``, in the container's ``--network none`` (only ``lo``: not even the proxy's forwarder
   runs), its output bounded. A non-root agent could change nothing on test.sh's search paths: every
   entry of PATH, PYTHONPATH, LD_LIBRARY_PATH, ... (the image's or the task's) that the agent's uid
   can write, or whose parents it can, is dropped (checked in the container as that uid), HOME is a
   fresh directory of the verifier's (root's own /root where it is root and the agent cannot write
   it), and the harness's bin dirs are not on its PATH. test.sh's shell waits on its first line until
   the host has named its pid;
4. everything test.sh left running is killed (from the host), ``/logs/verifier`` is taken back, and
   the host reads ``reward.json`` first (an object of numbers, or one number), else ``reward.txt``
   (one number), never following a link. **The reward channel**: a fanotify watch (the kernel's record,
   sandbox/fs_writers.py) named the process behind every write to a reward file; where test.sh's own
   shell wrote one, a reward file written by any other process (the code under test that test.sh ran,
   at import or from something it left running) is the ``reward-writer`` tampering flag: 0, not
   masked (`writer_flags`). Missing, empty, unparsable, not a regular file or non-finite is
   ``no_reward`` (Harbor: ``RewardFileNotFoundError``, ``RewardFileEmptyError``): masked only where the
   verifier writes a reward on the task's untouched image (the contract's control, rewards/grader.py),
   else the submission's ``broke_grading``, 0.
5. **A checker ended early** (the code under test running in the checker's own process, ``os._exit(0)``
   at import, so test.sh pays for a check that never ran): a paying run must leave what the task's
   solution's run leaves under /logs/verifier besides the reward (`verifier_outputs`: a
   ``pytest --ctrf`` report, a results file, written at the checker's end), at least as many entries
   of each directory and extension (so a name with a time in it still matches). Fewer is the
   ``verifier-ended-early`` tampering flag: 0, not masked (`ended_early`; the solution's run is kept
   once per task and node: rewards/grader.py). A checker that writes nothing but the reward leaves
   nothing to compare, and a targeted exit that writes the report first is not told apart
   (docs/reliability.md); ``polar tasks audit`` finds those tasks.

Where the task asks for a separate verifier (``[verifier] environment_mode = "separate"``, or a
``[verifier.environment]`` table), steps 2-4 run in a fresh container instead, holding only the
agent's artifacts (rewards/harbor_separate.py), after step 1 in the agent's.

The scalar reward of a multi-key ``reward.json`` (the whole object is kept in ``GradeResult.rewards``,
so on the trajectory's ``grading``): the key ``reward_key`` names (``--reward-key``; absent key:
``no_reward``), else the key ``reward``, else the only key; several keys none of them ``reward`` and no
``--reward-key`` is ``no_reward`` too (a guess would train on the wrong number). ``resolved`` means a
scalar of at least 1.0.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import stat
import time
from collections import Counter
from pathlib import Path

from polar_env.grades import GradeResult, GradingMode
from polar_env.outcomes import FailureKind
from polar_env.rewards.grading import LOG_TAIL_CHARS
from polar_env.rewards.harbor_separate import separate_box
from polar_env.sandbox.base import RunResult, run_process_tree
from polar_env.sandbox.container import (
    FALLBACK_PATH,
    ROOT_PATH,
    ContainerError,
    ContainerSandbox,
    engine_run,
    image_env,
    is_root,
)
from polar_env.sandbox.fs_writers import Writers
from polar_env.tasks.harbor_config import TESTS_DIR, VERIFIER_DIR, VERIFIER_HOME
from polar_env.tasks.harbor_env import HarborEnvError, resolve
from polar_env.tasks.models import Task
from polar_env.tasks.runtime import WorkspaceUnavailable, container_spec, task_spec

# the variables that name where programs, libraries or startup files are looked up (":"-separated)
SEARCH_VARS = (
    "PATH",
    "PYTHONPATH",
    "PYTHONUSERBASE",
    "PYTHONSTARTUP",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "NODE_PATH",
    "PERL5LIB",
    "RUBYLIB",
    "BASH_ENV",
    "ENV",
)
MAX_REWARD_BYTES = 64 << 10
MAX_OUTPUT_BYTES = 1 << 20
REWARD_FILES = ("reward.json", "reward.txt")  # in the order they are read
# test.sh's own shell, held on its first line until the host has named its pid (`_name_the_shell`)
GATED_TEST_SH = f"read _ && exec bash {TESTS_DIR}/test.sh"
SHELL_SEEN_S = 30.0


class RewardError(ValueError):
    """The verifier's reward cannot be read as a number; the message says which file and why."""


# Run as the agent's uid: print each POLAR_V_<NAME> variable's entries that this uid cannot change (an
# absolute path of which no existing part, followed or not, is writable by it or its own).
SAFE_PATHS_SCRIPT = r"""PATH=/usr/bin:/bin
mine() { while :; do if [ -e "$1" ] || [ -L "$1" ]; then { [ -w "$1" ] || [ -O "$1" ]; } && return 0; fi
  [ "$1" = / ] && return 1; set -- "$(dirname -- "$1")"; done; }
safe() { case $1 in /*) ;; *) return 1 ;; esac; mine "$1" && return 1
  r=$(readlink -f -- "$1") && [ -n "$r" ] && mine "$r" && return 1; return 0; }
for v in $(env | sed -n 's/^POLAR_V_\([A-Z_]*\)=.*/\1/p'); do eval "val=\$POLAR_V_$v"; out=
  IFS=:; for d in $val; do unset IFS; safe "$d" && out=${out:+$out:}$d; IFS=:; done; unset IFS
  printf '%s=%s\n' "$v" "$out"; done"""


def read_reward_file(directory: Path) -> tuple[str, str] | None:
    """The first reward file of ``directory`` (the host's view of /logs/verifier) and its first bytes, as
    Harbor reads them (reward.json first); None when there is none. Never followed: a link, a directory
    or anything but a regular file in its place is a `RewardError`."""
    for name in REWARD_FILES:
        path = directory / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise RewardError(f"{VERIFIER_DIR}/{name} is not a regular file ({exc.strerror})") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise RewardError(f"{VERIFIER_DIR}/{name} is not a regular file")
            return name, os.read(fd, MAX_REWARD_BYTES + 1).decode("utf-8", "replace")
        finally:
            os.close(fd)
    return None


def writer_flags(events: list[tuple[int, str]] | None, shell: int | None) -> dict[str, str]:
    """The reward channel's finding from the kernel's record of who wrote the reward files (`Writers`):
    where test.sh's own shell (host pid ``shell``) writes a reward file itself, a reward file written by
    any other process (the code under test that test.sh ran, something it left running) is tampering.
    Where the shell writes none, its checker's write stands (whether tested code runs in that checker
    is the task's design: ``polar tasks audit``)."""
    if events is None:
        return {
            "note:reward-writers-unchecked": (
                "fanotify needs host root: the reward files' writers were not checked"
            )
        }
    writers = {pid for pid, name in events if name in REWARD_FILES}
    others = writers - {shell}
    if shell in writers and others:
        return {
            "reward-writer": f"a reward file was written by {len(others)} process(es) besides test.sh's own "
            f"shell (host pids {sorted(others)[:5]}): the code under test wrote it"
        }
    return {}


def verifier_outputs(directory: Path, limit: int = 1000) -> list[str]:
    """The entries the verifier left in ``directory`` (the host's view of /logs/verifier, taken back)
    besides its reward files: regular files, as paths relative to it (links unfollowed; at most
    ``limit``)."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = str(path.relative_to(directory))
            if rel not in REWARD_FILES and stat.S_ISREG(os.lstat(path).st_mode):
                found.append(rel)
                if len(found) == limit:
                    return found
    return found


def _kinds(outputs: list[str]) -> Counter[tuple[str, str]]:
    """How many outputs of each (directory, extension): a report whose name holds a time still counts."""
    return Counter((os.path.dirname(p), os.path.splitext(p)[1]) for p in outputs)


def ended_early(result: GradeResult, solution: GradeResult) -> str | None:
    """Why a paying verifier run ``result`` looks ended before its checker's end: it left fewer outputs of
    a kind than the task's solution's run (`verifier_outputs`); None where it left as many."""
    want, got = _kinds(solution.verifier_outputs), _kinds(result.verifier_outputs)
    short = sorted(kind for kind, n in want.items() if got[kind] < n)
    if not short:
        return None
    shown = ", ".join(f"{d or '.'}/*{ext or '(no extension)'}" for d, ext in short[:3])
    return (
        f"the verifier paid but left no {shown} in {VERIFIER_DIR}, which it writes on the task's "
        f"solution ({', '.join(solution.verifier_outputs[:3])}): its checker ended before its end"
    )


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RewardError(f"{where}: {value!r} is not a finite number")
    return float(value)


def parse_rewards(name: str, text: str) -> dict[str, float]:
    """The rewards a reward file holds (``reward.txt``: ``{"reward": x}``), as Harbor reads them."""
    if not text.strip():
        raise RewardError(f"{VERIFIER_DIR}/{name} is empty")
    if len(text.encode()) > MAX_REWARD_BYTES:
        raise RewardError(f"{VERIFIER_DIR}/{name} is larger than {MAX_REWARD_BYTES} bytes")
    if name == "reward.txt":
        try:
            value = float(text.strip())
        except ValueError as exc:
            raise RewardError(f"{VERIFIER_DIR}/reward.txt: not one number: {text.strip()[:80]!r}") from exc
        return {"reward": _number(value, f"{VERIFIER_DIR}/reward.txt")}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RewardError(f"{VERIFIER_DIR}/reward.json: not JSON: {exc}") from exc
    if not isinstance(data, dict):
        return {"reward": _number(data, f"{VERIFIER_DIR}/reward.json")}
    if not data:
        raise RewardError(f"{VERIFIER_DIR}/reward.json is an empty object")
    return {str(k): _number(v, f"{VERIFIER_DIR}/reward.json key {k!r}") for k, v in data.items()}


def scalar_reward(rewards: dict[str, float], reward_key: str | None = None) -> float:
    """The one number trained on: ``reward_key``'s, else ``reward``'s, else the only key's."""
    if reward_key is not None:
        if reward_key not in rewards:
            raise RewardError(
                f"reward.json has no key {reward_key!r} (--reward-key); keys: {', '.join(rewards)}"
            )
        return rewards[reward_key]
    if "reward" in rewards:
        return rewards["reward"]
    if len(rewards) == 1:
        return next(iter(rewards.values()))
    raise RewardError(
        f"reward.json has several keys ({', '.join(rewards)}) and none is 'reward': "
        f"choose the scalar with --reward-key"
    )


def verifier_user(task: Task, box: ContainerSandbox) -> str:
    """``[verifier] user`` as the task names it, else the agent's own (Harbor: the image's default user,
    as the agent's is here too: root where the image's user is root)."""
    assert task.harbor is not None
    user = task.harbor.config.verifier.user
    return str(user) if user is not None else f"{box.spec.uid}:{box.spec.uid}"


def _uid(box: ContainerSandbox, user: str) -> int:
    """The container uid of ``user`` (a number, ``root``, or a name looked up in the container)."""
    name = user.split(":")[0]
    if name.isdigit() or is_root(name):
        return int(name) if name.isdigit() else 0
    return int(engine_run(box.exec_argv(["id", "-u", name], {}, user="0")).decode().strip())


def safe_search_env(box: ContainerSandbox, user: str, env: dict[str, str]) -> dict[str, str]:
    """test.sh's search variables (`SEARCH_VARS`: ``env``'s, else the image's) with every entry the
    agent's uid could change dropped, checked in ``box`` as that uid; HOME is root's /root where the
    verifier is root and that is safe, else the fresh `VERIFIER_HOME`. An empty PATH is refused (bash
    would look in the workdir). A root agent could change every entry (the whole container is its):
    the image's are kept as they are, and HOME is the fresh one (docs/reliability.md says what that
    leaves)."""
    image = {**image_env(box.engine, box.image), **box.spec.env}  # what every exec inherits
    wanted = {v: env.get(v, image.get(v)) for v in SEARCH_VARS}
    wanted = {v: x for v, x in wanted.items() if x is not None} | {"PATH": wanted["PATH"] or FALLBACK_PATH}
    if box.spec.uid == 0:
        return {**wanted, "HOME": VERIFIER_HOME}
    if is_root(user):
        wanted["HOME"] = "/root"
    checks = {f"POLAR_V_{v}": x for v, x in wanted.items()}
    agent = f"{box.spec.uid}:{box.spec.uid}"
    out = engine_run(box.exec_argv(["/bin/sh", "-c", SAFE_PATHS_SCRIPT], checks, user=agent, path=ROOT_PATH))
    safe = {
        key: value
        for key, _, value in (line.partition("=") for line in out.decode().splitlines() if "=" in line)
    }
    if set(safe) != set(wanted):
        raise ContainerError(f"the search-path check answered {sorted(safe)}, not {sorted(wanted)}")
    if not safe["PATH"]:
        raise ContainerError(f"every PATH directory of test.sh ({wanted['PATH']}) is writable by the agent")
    safe["HOME"] = safe.get("HOME") or VERIFIER_HOME
    return safe


async def verify(task: Task, box: ContainerSandbox, *, reward_key: str | None = None) -> GradeResult:
    """Run the task's verifier for ``box`` (the agent's container, its harness ended): in it, or in a
    fresh container holding the agent's artifacts where the task asks for a separate verifier
    (rewards/harbor_separate.py). Never raises."""
    assert task.harbor is not None
    t0 = time.monotonic()
    config = task.harbor.config.verifier
    result = GradeResult(instance_id=task.instance_id, mode=GradingMode.harbor)
    try:
        await asyncio.to_thread(_kill_everything, box)
        if config.separate:
            async with separate_box(task, box) as (fresh, bundled):
                run, found = await _run_tests(task, fresh, result, t0, bundled=bundled)
        else:
            run, found = await _run_tests(task, box, result, t0, bundled=False)
    except (ContainerError, OSError) as exc:
        return _fail(result, FailureKind.infrastructure, f"container: {exc}", t0)
    except (HarborEnvError, WorkspaceUnavailable) as exc:  # a host variable unset since the task loaded
        return _fail(result, FailureKind.infrastructure, str(exc), t0)
    if run.timed_out:
        return _fail(result, FailureKind.test_timeout, f"tests/test.sh ran past {config.timeout_sec:g}s", t0)
    try:
        if isinstance(found, RewardError):
            raise found
        read = found
        if read is None:
            return _fail(
                result,
                FailureKind.no_reward,
                f"tests/test.sh wrote neither {VERIFIER_DIR}/reward.json "
                f"nor reward.txt (exit code {run.exit_code})",
                t0,
            )
        result.rewards = parse_rewards(*read)
        result.reward = scalar_reward(result.rewards, reward_key)
    except RewardError as exc:
        return _fail(result, FailureKind.no_reward, str(exc), t0)
    result.resolved = result.reward >= 1.0
    result.timings["total_s"] = time.monotonic() - t0
    return result


def _kill_everything(box: ContainerSandbox) -> None:
    """Every process of the container but its init and keep-alive, from the host where this is root."""
    if os.geteuid() == 0:
        box.kill_inside()
    else:
        box.kill_all()


def _hand_over(box: ContainerSandbox, task: Task, uid: int, *, bundled: bool) -> None:
    """The verifier's host directories made fresh (host side: no program of the container runs): an
    empty /logs/verifier and HOME, the verifier's (``uid``'s) to write; /tests the task's, root's
    and read-only (kept as the image holds them where ``bundled``)."""
    assert task.harbor is not None
    owner = box.host_uid(uid) if os.geteuid() == 0 else None
    for inside in (VERIFIER_DIR, VERIFIER_HOME):
        path = box.host_dir(inside)
        _empty(path)
        if owner is not None:
            os.chown(path, owner, owner)
        path.chmod(0o755 if inside == VERIFIER_DIR else 0o700)
        if owner is None:  # no host root: no uid but ours to hand it to (rootless engines map ours to root)
            path.chmod(0o777)
    if not bundled:
        tests = box.host_dir(TESTS_DIR)
        _empty(tests)
        shutil.copytree(task.harbor.tests_dir, tests, symlinks=False, dirs_exist_ok=True)
        for path in [tests, *tests.rglob("*")]:
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)


def _take_back(box: ContainerSandbox) -> None:
    """/logs/verifier no longer writable by any uid of the container (its files are read by the host)."""
    path = box.host_dir(VERIFIER_DIR)
    if os.geteuid() == 0:
        os.chown(path, 0, 0)
    path.chmod(0o700)


def _empty(path: Path) -> None:
    """Everything in ``path`` removed (links unfollowed, any depth: the directory is ours)."""
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


async def _name_the_shell(box: ContainerSandbox, named: dict[str, int]) -> None:
    """The host pid of test.sh's shell (`GATED_TEST_SH`, waiting on its first line): the one process of
    the container whose parent is outside it (an exec's first; everything else was killed), not the
    keep-alive. Never raises: a shell not seen is said by its absence in ``named``."""
    deadline = time.monotonic() + SHELL_SEEN_S
    while time.monotonic() < deadline:
        try:
            tops = [
                p
                for p in await asyncio.to_thread(box.host_processes)
                if not p.parent_inside and p.inner != box.keepalive_pid
            ]
        except (ContainerError, OSError):
            tops = []
        if len(tops) == 1:
            named["shell"] = tops[0].pid
            return
        await asyncio.sleep(0.02)


async def _run_tests(
    task: Task, box: ContainerSandbox, result: GradeResult, t0: float, *, bundled: bool
) -> tuple[RunResult, tuple[str, str] | None | RewardError]:
    """Steps 2-4 in ``box``: the verifier's host directories handed over, test.sh run (its shell's pid
    named first), everything left killed, the directory taken back and read (before ``box`` may go: a
    separate verifier's); returns the run and the reward file read (or why it cannot be), the channel's
    flags on ``result``."""
    assert task.harbor is not None
    config = task.harbor.config.verifier
    user = verifier_user(task, box)
    uid = await asyncio.to_thread(_uid, box, user)
    await asyncio.to_thread(_hand_over, box, task, uid, bundled=bundled)
    asked = resolve(
        config.env, f"{task.instance_id}: task.toml [verifier] env"
    )  # ${VAR} from the host, as Harbor
    env = {**asked, **safe_search_env(box, user, asked)}
    result.timings["setup_s"] = time.monotonic() - t0
    logs = box.host_dir(VERIFIER_DIR)
    watch = Writers.start(logs) if os.geteuid() == 0 else None
    named: dict[str, int] = {}
    try:
        run = await run_process_tree(
            # no in-container `timeout` wrapper: the exec's first process is test.sh's shell (the host kills
            # at the deadline)
            box.exec_argv(["sh", "-c", GATED_TEST_SH], env, user=user, path=env["PATH"], interactive=True),
            timeout_s=config.timeout_sec,
            stdin=b"\n",
            max_output_bytes=MAX_OUTPUT_BYTES,
            on_timeout=box.kill_all,
            before_stdin=(lambda: _name_the_shell(box, named)) if watch is not None else None,
        )
        await asyncio.to_thread(_kill_everything, box)  # nothing test.sh started writes after this
    finally:
        events = watch.stop() if watch is not None else None
        await asyncio.to_thread(_take_back, box)
    result.timings["tests_s"] = run.duration_s
    result.log_tail = (run.stdout_tail + run.stderr_tail)[-LOG_TAIL_CHARS:]
    if watch is not None and "shell" not in named and not run.timed_out:
        raise ContainerError(f"test.sh's shell was never seen in the container ({SHELL_SEEN_S:g}s)")
    result.flag_evidence.update(writer_flags(events, named.get("shell")))
    result.flags = sorted(result.flag_evidence)
    result.verifier_outputs = verifier_outputs(logs)
    try:
        return run, read_reward_file(logs)
    except RewardError as exc:
        return run, exc


async def grade_patch(
    task: Task, patch: str, *, engine: str, reward_key: str | None = None, solve: bool = False
) -> GradeResult:
    """A patch for a Harbor task (``polar eval``; the grader's control: none), or with ``solve`` the task's
    own ``solution/solve.sh`` (the early-exit rule's reference run): a fresh container of its image, the
    patch ``git apply``-ed in the workdir as the agent's user (a refusal is ``apply_failed``), or solve.sh
    run there, then the verifier."""
    import tempfile
    from pathlib import Path

    from polar_env.sandbox.base import SandboxSpec
    from polar_env.tasks.harbor import gold_command

    t0 = time.monotonic()
    result = GradeResult(instance_id=task.instance_id, mode=GradingMode.harbor)
    box: ContainerSandbox | None = None
    try:
        spec = container_spec(task, task_spec(task, SandboxSpec()), engine)  # type: ignore[arg-type]
        box = await asyncio.to_thread(
            ContainerSandbox.create, None, spec=spec, image=task.image, engine=engine
        )
        if solve:
            assert task.harbor is not None
            await box.run(
                ["bash", "-c", gold_command(task)], timeout_s=task.harbor.config.agent.timeout_sec or 600
            )
        elif patch.strip():
            with tempfile.TemporaryDirectory(prefix="polar-harbor-") as tmp:
                (Path(tmp) / "model.patch").write_text(patch, errors="surrogateescape")
                await box.copy_in(Path(tmp) / "model.patch", "/tmp/polar-model.patch")
            applied = await box.run(["git", "apply", "--verbose", "/tmp/polar-model.patch"], timeout_s=120)
            if applied.exit_code != 0:
                result.log_tail = (applied.stdout_tail + applied.stderr_tail)[-LOG_TAIL_CHARS:]
                return _fail(result, FailureKind.apply_failed, "the patch does not apply", t0)
            result.patch_applied = True
        return await verify(task, box, reward_key=reward_key)
    except (ContainerError, WorkspaceUnavailable, OSError) as exc:
        return _fail(result, FailureKind.infrastructure, f"container: {exc}", t0)
    finally:
        if box is not None:
            await box.destroy()


def _fail(result: GradeResult, kind: FailureKind, error: str, t0: float) -> GradeResult:
    result.failure_kind, result.error, result.reward, result.resolved = kind, error, 0.0, False
    result.timings["total_s"] = time.monotonic() - t0
    return result

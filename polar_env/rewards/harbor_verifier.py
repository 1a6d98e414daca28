"""The Harbor verifier contract: a task's own ``tests/test.sh`` decides its reward, in the agent's container.

Harbor (and NeMo Gym, which runs Harbor folders natively) grade a task after the agent is done, in
the environment the agent left: the agent never saw ``tests/`` or ``solution/`` (neither is in the
image: it is built from ``environment/`` only, and nothing of the task folder is mounted). Here,
once the harness has ended:

1. every process of the agent's uid in the container is killed (nothing it left running can write
   after the next step);
2. ``/logs/verifier`` and ``/tests`` are removed and made again, empty and root-owned, so a reward the
   agent planted is gone; ``tests/`` is copied in, root-owned and read-only;
3. ``bash /tests/test.sh`` runs in the workdir as ``[verifier] user``, else as the agent's uid (root
   only where the task asks for it: the agent's code that test.sh runs then cannot rewrite /tests,
   which root's DAC_OVERRIDE could), with ``[verifier] env``, under ``[verifier] timeout_sec``, in the
   container's ``--network none`` (only ``lo``: no network at all, not even the proxy's forwarder is
   running), its output bounded. Nothing the agent could write is on its search paths: every entry of
   PATH, PYTHONPATH, LD_LIBRARY_PATH, ... (the image's or the task's) that the agent's uid can write,
   or whose parents it can, is dropped (checked in the container as that uid), HOME is a fresh
   directory of the verifier's (root's own /root where it is root and the agent cannot write it), and
   the harness's bin dirs are not on its PATH;
4. every process test.sh left behind is killed (those of a non-root verifier by its own uid, since
   root has no CAP_KILL here; then root's, all but the init and the keep-alive, by pid), then
   ``/logs/verifier/reward.json`` is read first (an object of numbers, or one number), else
   ``reward.txt`` (one number). Missing, empty, unparsable or non-finite is ``no_reward``: its own
   failure kind, masked by default and never trained as 0 (Harbor: ``RewardFileNotFoundError``,
   ``RewardFileEmptyError``).

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
import shlex
import time

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
from polar_env.tasks.harbor_env import HarborEnvError, resolve
from polar_env.tasks.models import Task
from polar_env.tasks.runtime import WorkspaceUnavailable, container_spec, task_spec

VERIFIER_DIR = "/logs/verifier"
TESTS_DIR = "/tests"
VERIFIER_HOME = "/var/lib/polar-verifier-home"  # root-made, fresh each time: no part of it is the agent's
# the variables that name where programs, libraries or startup files are looked up (":"-separated)
SEARCH_VARS = ("PATH", "PYTHONPATH", "PYTHONUSERBASE", "PYTHONSTARTUP", "LD_LIBRARY_PATH", "LD_PRELOAD",
               "NODE_PATH", "PERL5LIB", "RUBYLIB", "BASH_ENV", "ENV")
MAX_REWARD_BYTES = 64 << 10
MAX_OUTPUT_BYTES = 1 << 20
REWARD_FILES = ("reward.json", "reward.txt")  # in the order they are read


class RewardError(ValueError):
    """The verifier's reward cannot be read as a number; the message says which file and why."""


def _clean_script(verifier_user: str, *, keep_tests: bool = False) -> str:
    """Root's reset before the tests: fresh, empty, root-owned /logs/verifier and /tests (kept where
    the image holds the tests), and a fresh HOME for the verifier (the agent's HOME may hold a
    ``.local`` site-packages that python would load)."""
    user = shlex.quote(verifier_user)
    tests = "" if keep_tests else TESTS_DIR
    return (f"rm -rf {VERIFIER_DIR} {tests} {VERIFIER_HOME}; if [ -L /logs ] || [ ! -d /logs ]; then rm -rf /logs; fi; "
            f"mkdir -p {VERIFIER_DIR} {TESTS_DIR} {VERIFIER_HOME} && chown 0:0 /logs && chmod 0755 /logs && "
            f"chown {user} {VERIFIER_DIR} {VERIFIER_HOME} && chmod 0755 {VERIFIER_DIR} && chmod 0700 {VERIFIER_HOME}")


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


def _kill_leftovers(keepalive: int | None) -> str:
    """Before the reward is read, every process still in the container but its init, its keep-alive
    (the pid recorded at the start: a process test.sh left can take its name, never its pid) and this
    shell dies: nothing test.sh started (the agent's code it ran, as the verifier's user) rewrites the reward."""
    spare = " ".join(f'[ "$p" = {pid} ] ||' for pid in (1, keepalive) if pid is not None)
    return f'for d in /proc/[0-9]*; do p=${{d#/proc/}}; {spare} [ "$p" = $$ ] || kill -KILL $p 2>/dev/null; done; '


def _read_script(keepalive: int | None = None) -> str:
    """Print which reward file exists (json first) and its first bytes; exit 3 when there is none."""
    return _kill_leftovers(keepalive) + "; ".join(f"if [ -f {VERIFIER_DIR}/{name} ]; then echo {name}; head -c {MAX_REWARD_BYTES + 1} "
                     f"{VERIFIER_DIR}/{name}; exit 0; fi" for name in REWARD_FILES) + "; exit 3"


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
            raise RewardError(f"reward.json has no key {reward_key!r} (--reward-key); keys: {', '.join(rewards)}")
        return rewards[reward_key]
    if "reward" in rewards:
        return rewards["reward"]
    if len(rewards) == 1:
        return next(iter(rewards.values()))
    raise RewardError(f"reward.json has several keys ({', '.join(rewards)}) and none is 'reward': "
                      f"choose the scalar with --reward-key")


def verifier_user(task: Task, box: ContainerSandbox) -> str:
    """``[verifier] user`` as the task names it, else the agent's own uid (Harbor: the image's
    default user, usually root; here root only where the task asks for it)."""
    assert task.harbor is not None
    user = task.harbor.config.verifier.user
    return str(user) if user is not None else f"{box.spec.uid}:{box.spec.uid}"


def safe_search_env(box: ContainerSandbox, user: str, env: dict[str, str]) -> dict[str, str]:
    """test.sh's search variables (`SEARCH_VARS`: ``env``'s, else the image's) with every entry the
    agent's uid could change dropped, checked in ``box`` as that uid; HOME is root's /root where the
    verifier is root and that is safe, else the fresh `VERIFIER_HOME`. An empty PATH is refused (bash
    would look in the workdir)."""
    image = {**image_env(box.engine, box.image), **box.spec.env}  # what every exec inherits
    wanted = {v: env.get(v, image.get(v)) for v in SEARCH_VARS}
    wanted = {v: x for v, x in wanted.items() if x is not None} | {"PATH": wanted["PATH"] or FALLBACK_PATH}
    if is_root(user):
        wanted["HOME"] = "/root"
    checks = {f"POLAR_V_{v}": x for v, x in wanted.items()}
    agent = f"{box.spec.uid}:{box.spec.uid}"
    out = engine_run(box.exec_argv(["/bin/sh", "-c", SAFE_PATHS_SCRIPT], checks, user=agent, path=ROOT_PATH))
    safe = dict(line.partition("=")[::2] for line in out.decode().splitlines() if "=" in line)
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
        box.kill_all()
        if config.separate:
            async with separate_box(task, box) as (fresh, bundled):
                run, read = await _run_tests(task, fresh, result, t0, bundled=bundled)
        else:
            run, read = await _run_tests(task, box, result, t0, bundled=False)
    except (ContainerError, OSError) as exc:
        return _fail(result, FailureKind.infrastructure, f"container: {exc}", t0)
    except (HarborEnvError, WorkspaceUnavailable) as exc:  # a host variable unset since the task loaded
        return _fail(result, FailureKind.infrastructure, str(exc), t0)
    if run.timed_out:
        return _fail(result, FailureKind.test_timeout, f"tests/test.sh ran past {config.timeout_sec:g}s", t0)
    if read.exit_code == 3:
        return _fail(result, FailureKind.no_reward, f"tests/test.sh wrote neither {VERIFIER_DIR}/reward.json "
                     f"nor reward.txt (exit code {run.exit_code})", t0)
    name, _, text = read.stdout_tail.partition("\n")
    try:
        result.rewards = parse_rewards(name, text)
        result.reward = scalar_reward(result.rewards, reward_key)
    except RewardError as exc:
        return _fail(result, FailureKind.no_reward, str(exc), t0)
    result.resolved = result.reward >= 1.0
    result.timings["total_s"] = time.monotonic() - t0
    return result


async def _run_tests(task: Task, box: ContainerSandbox, result: GradeResult, t0: float, *,
                     bundled: bool) -> tuple[RunResult, RunResult]:
    """Steps 2-4 in ``box``: fresh dirs (``/tests`` kept, made root's and read-only, where the image
    holds the tests), test.sh, its leftovers killed, the reward file read (``read``: exit 3 when none)."""
    assert task.harbor is not None
    config = task.harbor.config.verifier
    user = verifier_user(task, box)
    engine_run(box.exec_argv(["sh", "-c", _clean_script(user, keep_tests=bundled)], {}, user="0"))
    if not bundled:
        engine_run(box.cp_in_argv(task.harbor.tests_dir, TESTS_DIR))
    engine_run(box.exec_argv(["sh", "-c", f"chown -R 0:0 {TESTS_DIR} && chmod -R a-w,a+rX {TESTS_DIR}"], {},
                             user="0"))
    asked = resolve(config.env, f"{task.instance_id}: task.toml [verifier] env")  # ${VAR} from the host, as Harbor
    env = {**asked, **safe_search_env(box, user, asked)}
    result.timings["setup_s"] = time.monotonic() - t0
    run = await run_process_tree(
        box.exec_argv(["bash", f"{TESTS_DIR}/test.sh"], env, user=user, timeout_s=config.timeout_sec,
                      path=env["PATH"]),
        timeout_s=config.timeout_sec, stdin=None, max_output_bytes=MAX_OUTPUT_BYTES, on_timeout=box.kill_all)
    result.timings["tests_s"] = run.duration_s
    result.log_tail = (run.stdout_tail + run.stderr_tail)[-LOG_TAIL_CHARS:]
    if not is_root(user):  # root cannot kill another uid's processes here (no CAP_KILL): that uid does
        await asyncio.to_thread(box.kill_all, user)
    read = await run_process_tree(box.exec_argv(["sh", "-c", _read_script(box.keepalive_pid)], {}, user="0"),
                                  timeout_s=60, stdin=None, max_output_bytes=MAX_REWARD_BYTES + 4096)
    return run, read


async def grade_patch(task: Task, patch: str, *, engine: str, reward_key: str | None = None) -> GradeResult:
    """A patch for a Harbor task (``polar eval``; the grader's control: none): a fresh container of its
    image, the patch ``git apply``-ed in the workdir as the agent's user (a refusal is ``apply_failed``),
    then the verifier."""
    import tempfile
    from pathlib import Path

    from polar_env.sandbox.base import SandboxSpec

    t0 = time.monotonic()
    result = GradeResult(instance_id=task.instance_id, mode=GradingMode.harbor)
    box: ContainerSandbox | None = None
    try:
        spec = container_spec(task, task_spec(task, SandboxSpec()), engine)  # type: ignore[arg-type]
        box = await asyncio.to_thread(ContainerSandbox.create, None, spec=spec, image=task.image, engine=engine)
        if patch.strip():
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

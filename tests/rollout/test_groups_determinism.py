"""Every harness's first prompt is a function of the task alone, under what production varies.

GRPO groups rollouts by the exact token ids of their first prompt (NeMo-RL's rule, reproduced by
``nemo_rl_groups``), so each real harness in the registry runs 3 rollouts of one bundled task that differ
in everything a cluster varies, and the first prompts must form one group of 3:

- the sandbox's hostname, user and time zone, and the time zones Etc/GMT-14 and Etc/GMT+12 put the
  sandbox's local date a day ahead of and behind UTC (26 hours apart: the dates differ whenever the
  test runs), which is how a harness that prints the date meets another day, with no faked clock;
- the host process's own HOSTNAME, USER and TZ (none of it may reach the sandbox);
- the task's base archive repacked per rollout: its members in another (shuffled) order, so files
  and directories are created in another order with other inode numbers, and other mtimes, days
  apart, as a fresh copy made at another time would have them.

The workspace is made as in production (``open_workspace``: unpack, one commit, copy into the
sandbox). The backend answers at once (the instant backend: one short final answer); only the first
call matters, so a rollout ends as soon as it is recorded (a harness that goes on is killed).
"""

from __future__ import annotations

import asyncio
import gzip
import io
import random
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from polar_env.backends.instant import InstantBackend
from polar_env.chat.template import ChatRenderer
from polar_env.episodes.task import episode_prompt
from polar_env.episodes.workspace import open_workspace
from polar_env.harness_adapters import adapter_names, get_adapter
from polar_env.harness_adapters.runner import run_episode_in_sandbox
from polar_env.proxy.app import ProxyServer
from polar_env.sandbox.base import SandboxSpec
from polar_env.tasks.loader import load_tasks
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.checks import first_prompt_ids, nemo_rl_groups
from polar_env.trajectory.export import to_nemo_gym_result

pytestmark = [pytest.mark.slow, pytest.mark.needs("bwrap", "npm")]

HARNESSES = adapter_names()
# a real tree in nested directories (three rollouts of it gave aider three repo maps)
TASK = "pallets__flask-5014"
DAY = 86400
# (sandbox spec changes, host environment) per rollout
ROLLOUTS = [
    ({}, {"HOSTNAME": "polar-ci", "USER": "root", "TZ": "UTC"}),
    (
        {"hostname": "node-b", "user": "worker", "env": {**SandboxSpec().env, "TZ": "Etc/GMT-14"}},
        {"HOSTNAME": "gpu-node-17", "USER": "svc-train", "TZ": "Asia/Kolkata"},
    ),
    (
        {
            "hostname": "dgx-a100-0042.cluster.internal",
            "user": "ray",
            "env": {**SandboxSpec().env, "TZ": "Etc/GMT+12"},
        },
        {"HOSTNAME": "login-3", "USER": "alice", "TZ": "America/Los_Angeles"},
    ),
]
FIRST_CALL_S = 300  # a cold start of the slowest (Hermes Agent imports for ~20 s on a busy 2-core machine)


def repack(archive: Path, dest: Path, seed: int) -> Path:
    """The archive's members in a shuffled order, with mtimes ``seed`` x 40 days (plus noise) in the past."""
    rng = random.Random(seed)
    with tarfile.open(archive) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]
    rng.shuffle(members)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as out:
        for member, data in members:
            member.mtime = int(time.time()) - seed * 40 * DAY - rng.randrange(DAY)
            out.addfile(member, io.BytesIO(data) if data is not None else None)
    dest.write_bytes(gzip.compress(buf.getvalue()))
    return dest


@pytest.fixture(scope="module")
def renderer(embedded_dir: Path) -> ChatRenderer:
    return ChatRenderer.from_pretrained(embedded_dir)


@pytest.fixture
async def proxy(renderer: ChatRenderer, proxy_factory, tmp_path: Path):
    tok = renderer.tokenizer
    backend = InstantBackend(tok.encode("Done.", add_special_tokens=False) + [tok.eos_token_id])
    server = proxy_factory(backend, admin_secret="admin", max_context=131072, default_max_tokens=64)
    await server.start(unix_socket=tmp_path / "sock" / "proxy.sock", port=None)
    server.unix_socket.parent.chmod(0o755)
    yield server
    await server.stop()


async def first_call(
    proxy: ProxyServer, adapter, task, name: str, machine: dict, scratch: Path
) -> tuple[list, str]:
    """One rollout up to its first recorded model call: (the calls, the sandbox's local date)."""
    sid, key = proxy.create_session(
        name,
        sampling={"temperature": 1.0, "top_p": 1.0, "max_tokens": 64},
        metadata={"task_id": task.instance_id, "group_id": task.instance_id, "harness": adapter.name},
    )
    spec = replace(
        SandboxSpec(
            proxy_socket_dir=proxy.unix_socket.parent, harness_dir=adapter.install_dir(), scratch_root=scratch
        ),
        **machine,
    )
    workspace = await open_workspace(task, spec, sandbox="bubblewrap")
    try:
        date = (await workspace.sandbox.run(["date", "+%F"])).stdout_tail.strip()
        run = asyncio.ensure_future(
            run_episode_in_sandbox(
                adapter,
                workspace.sandbox,
                proxy_socket_dir=spec.proxy_socket_dir,
                session_id=sid,
                session_key=key,
                model_name="policy",
                prompt=episode_prompt(task),
                timeout_s=FIRST_CALL_S,
            )
        )
        ledger = proxy.registry.ledger
        while not ledger.calls(sid) and not run.done():
            await asyncio.sleep(0.2)
        if not run.done():
            run.cancel()  # the first call is recorded: the rest of the rollout does not matter here
        result = await asyncio.gather(run, return_exceptions=True)
        await proxy.drain(sid)
        calls = ledger.calls(sid)
        assert calls, (name, result)
        return calls, date
    finally:
        await workspace.close()


@pytest.mark.parametrize("harness", HARNESSES)
async def test_first_prompt_is_one_group_across_machines_dates_and_workspace_copies(
    harness: str, proxy: ProxyServer, renderer: ChatRenderer, tmp_path: Path, monkeypatch
):
    adapter = get_adapter(harness)
    adapter.install()
    task = next(t for t in load_tasks("bundled") if t.instance_id == TASK)
    results, dates = [], []
    for n, (machine, host_env) in enumerate(ROLLOUTS):
        for name, value in host_env.items():
            monkeypatch.setenv(name, value)
        copy = task.model_copy(
            update={"base_archive": str(repack(Path(task.base_archive), tmp_path / f"base{n}.tar.gz", n))}
        )
        calls, date = await first_call(
            proxy, adapter, copy, f"{harness}-r{n}", machine, tmp_path / f"scratch{n}"
        )
        dates.append(date)
        traj = build_trajectory(proxy.registry.ledger.session(f"{harness}-r{n}"), calls, status="completed")
        results.append(to_nemo_gym_result(traj, reward=0.0).row())
    assert dates[1] != dates[2], dates  # the sandboxes' clocks were on different days
    prompts = [first_prompt_ids(r) for r in results]
    groups = nemo_rl_groups(prompts)
    if len(groups) != 1:
        a, b = prompts[groups[0][0]], prompts[groups[1][0]]
        i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        pytest.fail(
            f"{harness}: {len(groups)} NeMo-RL groups {groups} for one task; first difference at token {i} "
            f"of {len(a)}/{len(b)}: {renderer.tokenizer.decode(a[max(0, i - 30) : i + 30])!r} vs "
            f"{renderer.tokenizer.decode(b[max(0, i - 30) : i + 30])!r}"
        )
    assert len(prompts[0]) > 500  # the harness's real system prompt and tools, not a stub

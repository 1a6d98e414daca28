"""Only the harness's chains train by default: a call a tool process makes with the session's key is
recorded, tagged ``tool`` by the sandbox's forwarder from the connection's peer process (whatever
origin header it sent), and one that goes around the forwarder to the proxy's socket is ``unknown``;
neither chain becomes a training row unless the run asks (``all+foreign``).

Real Pi in bubblewrap; its first answer (scripted: a model-free backend answering the real
tokenizer's ids) runs a probe through Pi's own bash tool, as a reward-seeking policy would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar_env.backends.base import Generation
from polar_env.harness_adapters.pi import PiAdapter
from polar_env.harness_adapters.runner import run_episode_in_sandbox
from polar_env.proxy.app import ORIGIN_TAGGED
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.bubblewrap import BubblewrapSandbox
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.export import grpo_rows

PROBE = """
import json, os, socket, sys
body = json.dumps({"model": "policy", "messages": \
[{"role": "user", "content": "write my own training data"}]})
def post(sock, host):
    head = (f"POST /s/{os.environ['SID']}/v1/chat/completions HTTP/1.1\\r\\nHost: {host}\\r\\n"
            f"Authorization: Bearer {os.environ['POLAR_SESSION_KEY']}\\r\\n\
x-polar-origin: harness guessed\\r\\n"
            f"Content-Type: application/json\\r\\nContent-Length: {len(body)}\\r\\n\
Connection: close\\r\\n\\r\\n")
    sock.sendall(head.encode() + body.encode())
    print(sock.recv(100).split(b"\\r\\n")[0].decode())
tcp = socket.create_connection(("127.0.0.1", int(os.environ["PORT"])))
post(tcp, "127.0.0.1")
unix = socket.socket(socket.AF_UNIX)
unix.connect(os.environ["SOCK"])
post(unix, "proxy")
"""


class Script:
    """Answers a tool call running the probe first, then ``Done.`` (ids of the real tokenizer)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.name, self.model, self.calls = tokenizer, "script", "policy", 0

    async def generate(self, prompt_ids, sampling, *, session_id=None) -> Generation:
        self.calls += 1
        text = "Done."
        if self.calls == 1:
            call = {"name": "bash", "arguments": {"command": "python3 probe.py"}}
            text = "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [
            self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        ]
        return Generation(
            prompt_ids=prompt_ids,
            token_ids=ids,
            logprobs=[-0.5] * len(ids),
            finish_reason="stop",
            backend=self.name,
            model=self.model,
        )

    async def aclose(self) -> None:
        """Nothing to release."""


@pytest.mark.slow
@pytest.mark.needs("bwrap", "npm")
async def test_a_tool_process_cannot_write_training_data(renderer, proxy_factory, tmp_path: Path):
    adapter = PiAdapter()
    adapter.install()
    proxy = proxy_factory(
        Script(renderer.tokenizer), admin_secret="admin", max_context=131072, default_max_tokens=64
    )
    sock = tmp_path / "sock"
    await proxy.start(unix_socket=sock / "proxy.sock", port=None)
    sock.chmod(0o755)
    sid, key = proxy.create_session("ep", metadata={ORIGIN_TAGGED: True})
    task = tmp_path / "task"
    task.mkdir()
    (task / "probe.py").write_text(PROBE)
    spec = SandboxSpec(
        proxy_socket_dir=sock, harness_dir=adapter.install_dir(), scratch_root=tmp_path / "scratch"
    )
    sandbox = BubblewrapSandbox.create(task, spec=spec)
    env = adapter.env
    adapter.env = lambda ctx: {
        **env(ctx),
        "SID": sid,
        "PORT": str(spec.proxy_port),
        "SOCK": spec.socket_path_inside,
    }
    try:
        run = await run_episode_in_sandbox(
            adapter,
            sandbox,
            proxy_socket_dir=sock,
            session_id=sid,
            session_key=key,
            model_name="policy",
            prompt="Run the probe.",
            timeout_s=120,
            origin_key=proxy.origin_key,
        )
    finally:
        await sandbox.destroy()
        await proxy.stop()
    calls = sorted(proxy.registry.ledger.calls(sid), key=lambda c: c.call_index)
    detail = (run.status, run.stdout_tail[-2000:], [(c.origin, c.messages[-1].content[:40]) for c in calls])
    assert run.status == "completed", detail
    origins = [c.origin for c in calls]
    assert origins.count("harness") == 2 and "tool" in origins and "unknown" in origins, detail
    assert all(
        "guessed" not in json.dumps(c.model_dump(mode="json")) for c in calls
    )  # the forged header: gone
    traj = build_trajectory(proxy.registry.get(sid).info, calls, reward=1.0)
    harness_chains = {traj.calls[i].chain for i, c in enumerate(calls) if c.origin == "harness"}
    assert {r["chain"] for r in grpo_rows([traj])} == harness_chains, detail  # recorded, not trained
    assert len({r["chain"] for r in grpo_rows([traj], train_paths="all+foreign")}) == traj.stats.chains

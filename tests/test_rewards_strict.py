"""Fast unit tests of strict grading's judgement: what the tested code can put in the result stream,
the config pipe, the grader's argv and the tree never raises past the grader (masked) — it scores 0."""

from __future__ import annotations

import json
import os
import threading

from polar_env.rewards import strict_run
from polar_env.rewards.sandbox_exec import SandboxRun
from polar_env.rewards.strict_run import judge_stream

NONCE = "n" * 32
CONFIG = {"nonce": NONCE, "canaries": {}}


def _stream(*events: dict) -> bytes:
    return b"".join(json.dumps({"seq": i, "nonce": NONCE, **e}).encode() + b"\n" for i, e in enumerate(events))


def _honest(**end: object) -> list[dict]:
    return [{"t": "collected", "ids": ["t.py::test_a"]},
            {"t": "phase", "id": "t.py::test_a", "when": "setup", "outcome": "passed"},
            {"t": "phase", "id": "t.py::test_a", "when": "call", "outcome": "passed"},
            {"t": "phase", "id": "t.py::test_a", "when": "teardown", "outcome": "passed"},
            {"t": "end", "exitstatus": 0, "testsfailed": 0, **end}]


def _judge(data: bytes, rc: int = 0):
    return judge_stream(data, len(data), CONFIG, SandboxRun(rc, "", False, 0.1), "o/r")


def test_honest_stream_is_believed():
    out = _judge(_stream(*_honest()))
    assert out.valid and out.statuses == {"t.py::test_a": "PASSED"}, out


def test_line_nested_past_the_parser_is_forged_not_an_exception():
    out = _judge(b"[" * 100000 + b"\n" + _stream(*_honest()))
    assert not out.valid and out.violations[0].startswith("stream-forged"), out


def test_forged_field_types_are_forged_not_exceptions():
    for end in ({"exitstatus": "x"}, {"testsfailed": [1]}, {"exitstatus": {"a": 1}}):
        out = _judge(_stream(*_honest(**end)))
        assert not out.valid and any(v.startswith("stream-forged") for v in out.violations), (end, out)
    bad = _honest()
    bad[0]["ids"] = 7
    out = _judge(_stream(*bad))
    assert not out.valid and any(v.startswith("stream-forged") for v in out.violations), out
    out = _judge(_stream(*_honest(), {"t": "tampered", "keys": 5}))
    assert not out.valid, out


def _fake_sandbox(read_config: bool):
    def run(argv, *, pass_fds, **_):
        cfg_fd = pass_fds[0]
        if read_config:
            data = b""
            while chunk := os.read(cfg_fd, 65536):
                data += chunk
            got["config"] = json.loads(data)
        return SandboxRun(0, "", False, 0.0)
    got: dict = {}
    return run, got


def test_config_past_the_pipe_buffer_does_not_deadlock(monkeypatch, tmp_path):
    """A config larger than a pipe's 64 KiB buffer (many canaries) reaches the plugin whole, and a run
    that never reads it (a sandbox that did not start) still returns."""
    config = {"nonce": NONCE, "canaries": {f"tests/test_{i}.py": [["test_x", "pass", "assert 1"]] for i in range(8000)}}
    assert len(json.dumps(config)) > 4 * 65536
    for read_config in (True, False):
        run, got = _fake_sandbox(read_config)
        monkeypatch.setattr(strict_run, "run_sandboxed", run)
        done: list = []
        t = threading.Thread(target=lambda done=done: done.append(strict_run._run_with_stream(
            ["true"], tree=tmp_path, venv=tmp_path, env={}, timeout_s=5, grader_dir=tmp_path,
            grader_mount="/opt/g", config=config)), daemon=True)
        t.start()
        t.join(20)
        assert done, f"_run_with_stream blocked on the config pipe (reader: {read_config})"
        assert not read_config or got["config"] == config

"""Adapters: registry, cache layout, the config each harness gets (docs/harnesses.md), summaries."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from polar_env.cache import cache_root
from polar_env.cli.doctor import doctor_report, format_table
from polar_env.harness_adapters import HarnessContext, adapter_names, get_adapter
from polar_env.harness_adapters.base import json_lines
from polar_env.harness_adapters.claude_code import MODEL_VARS
from polar_env.harness_adapters.registry import ADAPTERS, NOISE_EXCLUDES, shell_tools
from polar_env.harness_adapters.runner import episode_command
from polar_env.harness_adapters.sources import (
    INSTALLED_MARKER,
    LOCKS_DIR,
    NpmPackage,
    PythonVenv,
    is_installed,
)

CTX = HarnessContext(session_id="sess-1", session_key="sk-polar-secret", model_name="policy", port=18080)


def test_registry_and_aliases():
    assert get_adapter("codex").name == "codex"
    assert get_adapter("claude_code").name == get_adapter("claude-code").name == "claude-code"
    assert get_adapter("pi").package == "@mariozechner/pi-coding-agent@0.73.1"
    with pytest.raises(KeyError):
        get_adapter("cursor")
    for name in ("codex", "claude-code", "pi"):
        version = get_adapter(name).version
        assert version and all(part.isdigit() for part in version.split(".")), "versions are pinned exactly"


def test_cache_dir_honours_polar_cache(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("POLAR_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    codex = get_adapter("codex")
    assert codex.install_dir() == tmp_path / "harnesses" / f"codex-{codex.version}"
    [npm] = codex.install_commands()
    assert npm[:4] == ["npm", "install", "--prefix", str(codex.install_dir())]
    assert npm[-1] == f"@openai/codex@{codex.version}"
    monkeypatch.delenv("POLAR_CACHE")
    assert cache_root() == Path.home() / ".cache" / "polar"


def test_an_npm_harness_that_needs_a_newer_node_gets_its_own_first_and_installs_under_it(tmp_path: Path):
    src = NpmPackage("some-cli", "1.2.3", "some", node="24.22.3")
    node, cli = src.install_commands(tmp_path)
    assert node[:4] == ["npm", "install", "--prefix", str(tmp_path)] and node[-1].startswith("node-linux-")
    assert node[-1].endswith("@24.22.3") and cli[-1] == "some-cli@1.2.3"
    assert cli[0] == "env" and cli[1].startswith(
        f"PATH={tmp_path}/node_modules/.bin:"
    )  # its install scripts see it
    assert src.identity != NpmPackage("some-cli", "1.2.3", "some").identity  # a host-node install is redone


def test_every_adapter_declares_a_wire_api_the_proxy_serves():
    from polar_env.proxy.app import API_MODULES

    assert {name: cls.wire_api in API_MODULES for name, cls in ADAPTERS.items()} == dict.fromkeys(
        ADAPTERS, True
    )


def test_install_is_a_noop_once_installed(tmp_path: Path):
    pi = get_adapter("pi")
    d = pi.install_dir(tmp_path)
    assert not pi.is_installed(tmp_path)
    (d / "node_modules" / ".bin").mkdir(parents=True)
    (d / "node_modules" / ".bin" / "pi").write_text("#!/bin/sh\n")
    assert not pi.is_installed(tmp_path)  # no marker: a half-finished install
    (d / INSTALLED_MARKER).write_text(f"{pi.source.identity}\n")
    assert pi.is_installed(tmp_path)
    assert pi.install(tmp_path) == d  # would run npm (no network in CI jobs without it) if not a no-op
    assert (tmp_path / "harnesses" / f".pi-{pi.version}.lock").exists()


def test_python_venv_source_installs_into_its_own_venv_and_launches_through_it(tmp_path: Path):
    """What a PyPI harness declares (docs/harnesses.md): a pinned requirement and a console script."""
    src = PythonVenv("mini-swe-agent", "1.0.0", "mini", extras=("litellm==1.2.3",))
    dest = tmp_path / "mini-1.0.0"
    venv, pip = src.install_commands(dest)
    assert venv == ["/usr/bin/python3", "-m", "venv", str(dest)]
    assert pip[:3] == [str(dest / "bin" / "python"), "-m", "pip"] and pip[-2:] == [
        "mini-swe-agent==1.0.0",
        "litellm==1.2.3",
    ]
    # a console script's #! names the host path of the venv, so it runs through the mounted interpreter
    assert src.launcher == ["/opt/harness/bin/python", "/opt/harness/bin/mini"]
    assert src.executable_in(dest) == dest / "bin" / "mini" and src.spec == "mini-swe-agent==1.0.0"


@pytest.mark.parametrize("name", [n for n, cls in ADAPTERS.items() if getattr(cls.source, "lock", None)])
def test_a_pypi_harness_installs_under_its_lock_and_a_changed_lock_reinstalls(name, tmp_path: Path):
    """Every dependency of a PyPI harness is pinned by its lock (pip constraints), the lock pins the
    harness itself at the adapter's version, and an install made under another lock is not reused."""
    src = ADAPTERS[name].source
    lock = LOCKS_DIR / src.lock
    pins = dict(line.split("==") for line in lock.read_text().splitlines() if "==" in line)
    assert pins[src.package] == src.version and all(v.strip() for v in pins.values())
    assert not [
        line
        for line in lock.read_text().splitlines()
        if line and not line.startswith("#") and "==" not in line
    ]
    pip = src.install_commands(tmp_path / "venv")[-1]
    assert pip[pip.index("-c") + 1] == str(lock)
    dest = tmp_path / "venv"
    src.executable_in(dest).parent.mkdir(parents=True)
    src.executable_in(dest).touch()
    (dest / INSTALLED_MARKER).write_text(f"{src.spec}\n")  # an install from before the lock
    assert not is_installed(src, dest)
    (dest / INSTALLED_MARKER).write_text(f"{src.identity}\n")
    assert is_installed(src, dest)


def test_harness_knowledge_lives_in_the_adapters():
    """The diff's noise, the scripted policy's shell tools and the proxy's volatile lines are the union
    of what each adapter declares; nothing else lists a harness."""
    from polar_env.proxy.volatile import RULES
    from polar_env.sandbox.base import BUILD_EXCLUDES

    for cls in ADAPTERS.values():
        assert set(cls.noise_dirs) <= set(NOISE_EXCLUDES)
        assert set(cls.volatile_rules) <= set(RULES)
        assert cls.shell_tool is None or cls.shell_tool in shell_tools()
    assert set(NOISE_EXCLUDES) - set(BUILD_EXCLUDES) == {
        d for cls in ADAPTERS.values() for d in cls.noise_dirs
    }
    assert not {".codex", ".claude", ".pi"} & set(BUILD_EXCLUDES)


def test_codex_config_matches_design():
    codex = get_adapter("codex")
    files = codex.config_files(CTX)
    assert list(files) == ["/home/agent/.codex/config.toml"]
    cfg = tomllib.loads(files["/home/agent/.codex/config.toml"])
    assert cfg["model"] == "policy" and cfg["model_provider"] == "polar"
    assert cfg["approval_policy"] == "never" and cfg["sandbox_mode"] == "danger-full-access"
    provider = cfg["model_providers"]["polar"]
    assert provider["base_url"] == "http://127.0.0.1:18080/s/sess-1/v1"
    assert provider["wire_api"] == "responses" and provider["env_key"] == "POLAR_SESSION_KEY"
    assert cfg["analytics"] == {"enabled": False}
    assert cfg["features"] == {"plugins": False, "apps": False, "remote_plugin": False}
    assert "sk-polar-secret" not in files["/home/agent/.codex/config.toml"]
    env = codex.env(CTX)
    assert env == {"CODEX_HOME": "/home/agent/.codex", "POLAR_SESSION_KEY": "sk-polar-secret"}
    cmd = codex.command(CTX, "fix the bug")
    assert cmd == [
        "/opt/harness/node_modules/.bin/codex",
        "exec",
        "--skip-git-repo-check",
        "--ephemeral",
        "--json",
        "fix the bug",
    ]


def test_claude_code_env_points_every_model_at_the_served_one():
    claude = get_adapter("claude-code")
    env = claude.env(CTX)
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:18080/s/sess-1"
    assert env["ANTHROPIC_API_KEY"] == "sk-polar-secret"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert {var: env[var] for var in MODEL_VARS} == dict.fromkeys(MODEL_VARS, "policy")
    assert "ANTHROPIC_DEFAULT_HAIKU_MODEL" in MODEL_VARS and "CLAUDE_CODE_SUBAGENT_MODEL" in MODEL_VARS
    assert "IS_SANDBOX" not in env
    root_ctx = HarnessContext(**{**CTX.__dict__, "as_root": True})
    assert claude.env(root_ctx)["IS_SANDBOX"] == "1"
    cmd = claude.command(CTX, "fix it")
    assert cmd[1:] == [
        "-p",
        "--dangerously-skip-permissions",
        "--output-format",
        "stream-json",
        "--verbose",
        "--model",
        "policy",
        "fix it",
    ]
    assert claude.config_files(CTX) == {}


def test_pi_models_json_and_offline():
    pi = get_adapter("pi")
    files = pi.config_files(CTX)
    models = json.loads(files["/home/agent/.pi/agent/models.json"])
    provider = models["providers"]["polar"]
    assert provider == {
        "baseUrl": "http://127.0.0.1:18080/s/sess-1/v1",
        "api": "openai-completions",
        "apiKey": "POLAR_SESSION_KEY",
        "models": [{"id": "policy"}],
    }
    assert json.loads(files["/home/agent/.pi/agent/settings.json"])["enableInstallTelemetry"] is False
    env = pi.env(CTX)
    assert env["PI_OFFLINE"] == "1" and env["PI_CODING_AGENT_DIR"] == "/home/agent/.pi/agent"
    assert env["POLAR_SESSION_KEY"] == "sk-polar-secret"
    assert pi.command(CTX, "go") == [
        "/opt/harness/node_modules/.bin/pi",
        "-p",
        "--no-session",
        "--mode",
        "json",
        "--provider",
        "polar",
        "--model",
        "policy",
        "go",
    ]


def test_gemini_cli_env_settings_and_command():
    gemini = get_adapter("gemini-cli")
    env = gemini.env(CTX)
    assert env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:18080/s/sess-1"  # the SDK appends /v1beta/...
    assert env["GEMINI_API_KEY"] == "sk-polar-secret" and env["GEMINI_TELEMETRY_ENABLED"] == "false"
    settings = json.loads(gemini.config_files(CTX)["/home/agent/.gemini/settings.json"])
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert (
        settings["privacy"]["usageStatisticsEnabled"] is False and settings["telemetry"]["enabled"] is False
    )
    assert settings["general"]["enableAutoUpdate"] is False
    assert gemini.command(CTX, "go") == [
        "/opt/harness/node_modules/.bin/gemini",
        "--yolo",
        "--output-format",
        "stream-json",
        "--model",
        "policy",
        "--prompt",
        "go",
    ]


def test_episode_command_starts_forwarder_first():
    cmd = episode_command(get_adapter("pi"), CTX, "go", socket_inside="/run/proxy/proxy.sock")
    assert cmd[:8] == [
        "/usr/bin/python3",
        "/opt/polar/forwarder.py",
        "--socket",
        "/run/proxy/proxy.sock",
        "--port",
        "18080",
        "--",
        "/opt/harness/node_modules/.bin/pi",
    ]


CODEX_STREAM = "\n".join(
    json.dumps(e)
    for e in [
        {"type": "thread.started", "thread_id": "t"},
        {"type": "turn.started"},
        {"type": "item.started", "item": {"id": "i0", "type": "command_execution", "command": "ls"}},
        {
            "type": "item.completed",
            "item": {"id": "i0", "type": "command_execution", "command": "ls", "exit_code": 0},
        },
        {"type": "item.completed", "item": {"id": "i1", "type": "file_change", "changes": []}},
        {"type": "item.completed", "item": {"id": "i2", "type": "agent_message", "text": "Done."}},
        {"type": "turn.completed", "usage": {"input_tokens": 10}},
    ]
)

CLAUDE_STREAM = "\n".join(
    json.dumps(e)
    for e in [
        {"type": "system", "subtype": "init", "model": "policy"},
        {"type": "assistant", "message": {"content": [{"type": "tool_use", "name": "Bash", "input": {}}]}},
        {"type": "user", "message": {"content": [{"type": "tool_result", "content": "ok"}]}},
        {"type": "assistant", "message": {"content": [{"type": "text", "text": "All done"}]}},
        {"type": "result", "subtype": "success", "is_error": False, "num_turns": 2, "result": "All done"},
    ]
)

PI_STREAM = "\n".join(
    json.dumps(e)
    for e in [
        {"type": "session", "version": 3},
        {"type": "agent_start"},
        {"type": "turn_start"},
        {
            "type": "message_end",
            "message": {"role": "assistant", "content": [{"type": "toolCall", "name": "bash"}]},
        },
        {"type": "tool_execution_end", "toolCallId": "c1", "toolName": "bash", "isError": False},
        {"type": "turn_end"},
        {"type": "turn_start"},
        {
            "type": "message_end",
            "message": {
                "role": "assistant",
                "content": [{"type": "text", "text": "Edited."}],
                "stopReason": "stop",
            },
        },
        {"type": "turn_end"},
        {"type": "agent_end", "messages": []},
    ]
)


# Gemini CLI 0.61.0's own stream-json output of a run (one shell call, then the answer in two deltas)
GEMINI_STREAM = "\n".join(
    json.dumps(e)
    for e in [
        {"type": "init", "session_id": "s", "model": "policy"},
        {"type": "message", "role": "user", "content": "Create out.txt containing hi"},
        {
            "type": "tool_use",
            "tool_name": "run_shell_command",
            "tool_id": "t0",
            "parameters": {"command": "ls"},
        },
        {"type": "tool_result", "tool_id": "t0", "status": "success", "output": ""},
        {"type": "message", "role": "assistant", "content": "Do", "delta": True},
        {"type": "message", "role": "assistant", "content": "ne.", "delta": True},
        {"type": "result", "status": "success", "stats": {"total_tokens": 210, "tool_calls": 1}},
    ]
)


def test_summaries_from_event_streams():
    s = get_adapter("codex").summarize("garbage line\n" + CODEX_STREAM)
    assert (s.turns, s.tool_calls, s.final_message, s.finished, s.unparsed_lines) == (1, 2, "Done.", True, 1)
    s = get_adapter("claude-code").summarize(CLAUDE_STREAM)
    assert (s.turns, s.tool_calls, s.final_message, s.finished, s.tool_names) == (
        2,
        1,
        "All done",
        True,
        ["Bash"],
    )
    s = get_adapter("pi").summarize(PI_STREAM[20:])  # a tail whose first line is cut
    assert (s.turns, s.tool_calls, s.final_message, s.finished) == (2, 1, "Edited.", True)
    s = get_adapter("gemini-cli").summarize(GEMINI_STREAM)
    assert (s.turns, s.tool_calls, s.final_message, s.finished, s.tool_names) == (
        2,
        1,
        "Done.",
        True,
        ["run_shell_command"],
    )


def test_summaries_report_failures():
    failed = json.dumps({"type": "turn.failed", "error": {"message": "stream disconnected"}})
    s = get_adapter("codex").summarize(failed)
    assert not s.finished and s.error == "stream disconnected"
    s = get_adapter("claude-code").summarize(
        json.dumps({"type": "result", "subtype": "error_max_turns", "is_error": True, "num_turns": 3})
    )
    assert not s.finished and s.error == "error_max_turns" and s.turns == 3
    pi_err = "\n".join(
        json.dumps(e)
        for e in [
            {
                "type": "message_end",
                "message": {
                    "role": "assistant",
                    "content": [],
                    "stopReason": "error",
                    "errorMessage": "500 boom",
                },
            },
            {"type": "agent_end"},
        ]
    )
    s = get_adapter("pi").summarize(pi_err)
    assert not s.finished and s.error == "500 boom"
    gemini_err = json.dumps(
        {"type": "result", "status": "error", "error": {"type": "Error", "message": "400 no"}}
    )
    s = get_adapter("gemini-cli").summarize(gemini_err)
    assert not s.finished and s.error == "400 no"
    assert json_lines("[1]\n{}\n") == ([{}], 1)


def test_doctor_rows_cover_harnesses_and_sandbox_tools(tmp_path: Path):
    rows = doctor_report(tmp_path)  # an empty cache: every harness missing
    names = [r.component for r in rows]
    for needed in (
        "bubblewrap",
        "setpriv",
        "node",
        "npm",
        "cgroups",
        "harness codex",
        "harness claude-code",
        "harness pi",
        "harness gemini-cli",
    ):
        assert needed in names
    harness_rows = {
        r.component.removeprefix("harness "): r for r in rows if r.component.startswith("harness ")
    }
    assert list(harness_rows) == adapter_names()
    for name, row in harness_rows.items():  # each row names the exact commands its source installs with
        assert (
            not row.installed
            and " ".join(get_adapter(name).install_commands(tmp_path)[-1]) in row.fix_command
        )
    table = format_table(rows)
    assert table.splitlines()[0].startswith("component") and "harness pi" in table


def test_qwen_code_settings_and_env_point_at_the_proxy_only():
    qwen = get_adapter("qwen-code")
    settings = json.loads(qwen.config_files(CTX)["/home/agent/.qwen/settings.json"])
    assert settings["security"]["auth"]["selectedType"] == "openai" and settings["model"]["name"] == "policy"
    assert (
        settings["privacy"]["usageStatisticsEnabled"] is False and settings["telemetry"]["enabled"] is False
    )
    assert settings["general"]["enableAutoUpdate"] is False
    env = qwen.env(CTX)
    assert (
        env["OPENAI_BASE_URL"] == "http://127.0.0.1:18080/s/sess-1/v1"
        and env["OPENAI_API_KEY"] == "sk-polar-secret"
    )
    assert env["QWEN_USAGE_STATISTICS_ENABLED"] == env["QWEN_TELEMETRY_ENABLED"] == "0"
    assert qwen.command(CTX, "go")[:1] == ["/opt/harness/node_modules/.bin/qwen"] and "yolo" in qwen.command(
        CTX, "go"
    )


def test_opencode_provider_references_the_key_and_nothing_calls_out():
    opencode = get_adapter("opencode")
    text = opencode.config_files(CTX)["/home/agent/.config/opencode/opencode.json"]
    cfg = json.loads(text)
    assert "sk-polar-secret" not in text
    provider = cfg["provider"]["polar"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {
        "baseURL": "http://127.0.0.1:18080/s/sess-1/v1",
        "apiKey": "{env:POLAR_SESSION_KEY}",
    }
    assert cfg["model"] == cfg["small_model"] == "polar/policy" and cfg["enabled_providers"] == ["polar"]
    env = opencode.env(CTX)
    assert env["POLAR_SESSION_KEY"] == "sk-polar-secret" and env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"
    assert "--title" in opencode.command(CTX, "go")  # a named session: no title-generation call


def test_cline_providers_file_is_what_cline_auth_writes():
    cline = get_adapter("cline")
    cfg = json.loads(cline.config_files(CTX)["/home/agent/.cline/data/settings/providers.json"])
    entry = cfg["providers"]["openai-compatible"]
    assert cfg["lastUsedProvider"] == "openai-compatible" and entry["updatedAt"]
    assert entry["settings"] == {
        "provider": "openai-compatible",
        "apiKey": "sk-polar-secret",
        "model": "policy",
        "baseUrl": "http://127.0.0.1:18080/s/sess-1/v1",
    }
    # a run given --provider/--model/--key rewrites the file without the base URL
    assert cline.command(CTX, "go") == [
        "/opt/harness/node_modules/.bin/cline",
        "--json",
        "--config",
        "/home/agent/.cline",
        "go",
    ]
    assert cline.shell_tool is not None and cline.shell_tool.arguments("ls") == {"commands": ["ls"]}


OPENCODE_STREAM = "\n".join(
    json.dumps(e)
    for e in [
        {"type": "step_start", "part": {}},
        {"type": "tool_use", "part": {"tool": "bash", "state": {"status": "completed"}}},
        {"type": "step_finish", "part": {"reason": "tool-calls"}},
        {"type": "step_start", "part": {}},
        {"type": "text", "part": {"text": "Edited."}},
        {"type": "step_finish", "part": {"reason": "stop"}},
    ]
)

CLINE_STREAM = "\n".join(
    json.dumps(e)
    for e in [
        {"type": "agent_event", "event": {"type": "iteration_start", "iteration": 1}},
        {
            "type": "agent_event",
            "event": {"type": "content_start", "contentType": "tool", "toolName": "run_commands"},
        },
        {"type": "agent_event", "event": {"type": "iteration_end", "iteration": 1}},
        {"type": "agent_event", "event": {"type": "content_end", "contentType": "text", "text": "Edited."}},
        {"type": "agent_event", "event": {"type": "iteration_end", "iteration": 2}},
        {"type": "run_result", "finishReason": "completed", "text": "Edited."},
    ]
)


def test_new_harness_summaries():
    s = get_adapter("opencode").summarize(OPENCODE_STREAM)
    assert (s.turns, s.tool_calls, s.final_message, s.finished, s.tool_names) == (
        2,
        1,
        "Edited.",
        True,
        ["bash"],
    )
    s = get_adapter("cline").summarize(CLINE_STREAM)
    assert (s.turns, s.tool_calls, s.final_message, s.finished, s.tool_names) == (
        2,
        1,
        "Edited.",
        True,
        ["run_commands"],
    )
    failed = get_adapter("cline").summarize(
        json.dumps({"type": "run_result", "finishReason": "error", "text": "boom"})
    )
    assert not failed.finished and failed.error == "boom"
    s = get_adapter("qwen-code").summarize(CLAUDE_STREAM)  # Qwen Code's stream-json is Claude Code's format
    assert (s.turns, s.tool_calls, s.final_message, s.finished) == (2, 1, "All done", True)

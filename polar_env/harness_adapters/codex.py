"""OpenAI Codex CLI: Responses API only, configured through ``$CODEX_HOME/config.toml``.

Plain ``OPENAI_BASE_URL`` is ignored and ``openai_base_url`` tries WebSockets first, so the proxy
is a custom model provider with ``wire_api = "responses"``; the key comes from ``env_key``.
Codex's own sandbox is off (``danger-full-access``): the Polar sandbox isolates.
"""

from __future__ import annotations

import json
import re

from polar_env.harness_adapters.base import (
    HarnessAdapter,
    HarnessContext,
    HarnessSummary,
    ShellTool,
    VolatileRule,
    json_lines,
)
from polar_env.harness_adapters.sources import NpmPackage

KEY_ENV = "POLAR_SESSION_KEY"
TOOL_ITEMS = {"command_execution", "file_change", "mcp_tool_call", "web_search"}


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


class CodexAdapter(HarnessAdapter):
    name = "codex"
    source = NpmPackage("@openai/codex", "0.171.0", "codex")
    wire_api = "responses"
    shell_tool = ShellTool("exec_command", "cmd", wait_args={"yield_time_ms": 30000})
    noise_dirs = (".codex",)
    prefill_allowance_s = 480.0  # ~9.5k first-prompt tokens
    volatile_rules = (
        # its <environment_context>: today's date (faketime cannot help: Codex is a static musl binary
        # that ignores LD_PRELOAD) and the host's time zone
        VolatileRule(
            "codex-current-date",
            frozenset({"user"}),
            re.compile(r"^[ \t]*<current_date>\d{4}-\d{2}-\d{2}</current_date>\n", re.MULTILINE),
        ),
        VolatileRule(
            "codex-timezone",
            frozenset({"user"}),
            re.compile(r"^[ \t]*<timezone>[^<\n]*</timezone>\n", re.MULTILINE),
        ),
    )

    def codex_home(self, ctx: HarnessContext) -> str:
        return f"{ctx.home}/.codex"

    def config_toml(self, ctx: HarnessContext) -> str:
        return "\n".join(
            [
                f"model = {_toml_str(ctx.model_name)}",
                'model_provider = "polar"',
                'approval_policy = "never"',
                'sandbox_mode = "danger-full-access"',
                "check_for_update_on_startup = false",
                "",
                "[model_providers.polar]",
                'name = "polar"',
                f"base_url = {_toml_str(ctx.base_url)}",
                f'env_key = "{KEY_ENV}"',
                'wire_api = "responses"',
                "",
                "[analytics]",
                "enabled = false",
                "",
                "[features]",
                "plugins = false",
                "apps = false",
                "remote_plugin = false",
                "",
            ]
        )

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        return {f"{self.codex_home(ctx)}/config.toml": self.config_toml(ctx)}

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"CODEX_HOME": self.codex_home(ctx), KEY_ENV: ctx.session_key}

    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        return [*self.launcher, "exec", "--skip-git-repo-check", "--ephemeral", "--json", prompt]

    def summarize(self, stdout: str) -> HarnessSummary:
        events, bad = json_lines(stdout)
        s = HarnessSummary(events=len(events), unparsed_lines=bad)
        for ev in events:
            kind = ev.get("type")
            item = ev.get("item") or {}
            if kind == "item.completed":
                if item.get("type") == "agent_message":
                    s.final_message = item.get("text")
                elif item.get("type") in TOOL_ITEMS:
                    s.tool_calls += 1
                    s.tool_names.append(item["type"])
            elif kind == "turn.completed":
                s.turns += 1
                s.finished = True
            elif kind == "turn.failed":
                s.turns += 1
                s.finished = False
                s.error = str((ev.get("error") or {}).get("message", ev.get("error")))
            elif kind == "error":
                s.error = str(ev.get("message"))
        return s

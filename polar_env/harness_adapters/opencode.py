"""OpenCode: a custom OpenAI-compatible provider in ``~/.config/opencode/opencode.json``.

OpenCode talks to every provider through the AI SDK; ``@ai-sdk/openai-compatible`` is bundled in
its binary (nothing is fetched at run time) and speaks chat completions, the dialect it supports
for any server that is not a named vendor. The model list from the internet, auto-update, LSP
downloads, default plugins, sharing and Claude Code compatibility lookups are switched off by
environment; ``--title`` names the session so no extra title-generation call is made, and
``--auto`` approves its tools (the Polar sandbox isolates).
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

PROVIDER = "polar"
KEY_ENV = "POLAR_SESSION_KEY"
# its switches, each ``<PREFIX>_<name>=1`` (a fork renames the prefix: Kilo's KILO_)
OFFLINE_SWITCHES = (
    "DISABLE_MODELS_FETCH",
    "DISABLE_AUTOUPDATE",
    "DISABLE_LSP_DOWNLOAD",
    "DISABLE_DEFAULT_PLUGINS",
    "DISABLE_SHARE",
    "DISABLE_CLAUDE_CODE",
    "DISABLE_EXTERNAL_SKILLS",
    "DISABLE_TERMINAL_TITLE",
)


class OpenCodeAdapter(HarnessAdapter):
    name = "opencode"
    source = NpmPackage("opencode-ai", "1.18.33", "opencode")
    wire_api = "chat"
    shell_tool = ShellTool("bash", "command", wait_args={"timeout": 600000})  # ``timeout`` in ms
    noise_dirs = (".opencode",)
    config_name = "opencode"  # ~/.config/<config_name>/<config_name>.json
    env_prefix = "OPENCODE"
    offline_switches: tuple[str, ...] = OFFLINE_SWITCHES
    prefill_allowance_s = 480.0  # ~7.4k first-prompt tokens
    volatile_rules = (
        # "  Today's date: Mon Nov 30 2026" in the <env> block of its system prompt
        VolatileRule(
            "opencode-todays-date",
            frozenset({"system"}),
            re.compile(r"^[ \t]*Today's date: \w{3} \w{3} \d{2} \d{4}\n", re.MULTILINE),
        ),
    )

    def config(self, ctx: HarnessContext) -> dict:
        model = f"{PROVIDER}/{ctx.model_name}"
        return {
            "provider": {
                PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": PROVIDER,
                    "options": {"baseURL": ctx.base_url, "apiKey": f"{{env:{KEY_ENV}}}"},
                    "models": {ctx.model_name: {"name": ctx.model_name}},
                }
            },
            "model": model,
            "small_model": model,
            "enabled_providers": [PROVIDER],
            "autoupdate": False,
            "share": "disabled",
            "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
        }

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        path = f"{ctx.home}/.config/{self.config_name}/{self.config_name}.json"
        return {path: json.dumps(self.config(ctx), indent=2) + "\n"}

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {
            KEY_ENV: ctx.session_key,
            "XDG_CONFIG_HOME": f"{ctx.home}/.config",
            **{f"{self.env_prefix}_{switch}": "1" for switch in self.offline_switches},
        }

    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        return [
            *self.launcher,
            "run",
            "--format",
            "json",
            "--model",
            f"{PROVIDER}/{ctx.model_name}",
            "--title",
            "polar",
            "--auto",
            prompt,
        ]

    def summarize(self, stdout: str) -> HarnessSummary:
        events, bad = json_lines(stdout)
        s = HarnessSummary(events=len(events), unparsed_lines=bad)
        for ev in events:
            kind, part = ev.get("type"), ev.get("part") or {}
            if kind == "step_finish":
                s.turns += 1
            elif kind == "tool_use":
                s.tool_calls += 1
                s.tool_names.append(str(part.get("tool")))
            elif kind == "text":
                s.final_message = part.get("text") or s.final_message
            elif kind == "error":
                s.error = str((ev.get("error") or {}).get("data", {}).get("message") or ev.get("error"))
        s.finished = s.turns > 0 and s.error is None
        return s

"""Qwen Code (a Gemini CLI fork): OpenAI chat completions, configured by ``~/.qwen/settings.json``
plus the ``OPENAI_*`` environment.

Chat completions is the dialect Qwen Code is built around (its own models are served over it;
``openai-responses``, ``anthropic`` and ``gemini`` are also offered). Usage statistics and
telemetry are off in both the settings and the environment (the environment wins over settings),
auto-update and chat recording are off, and the approval mode is ``yolo``: the Polar sandbox isolates.
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
)
from polar_env.harness_adapters.claude_code import stream_json_summary
from polar_env.harness_adapters.sources import NpmPackage


class QwenCodeAdapter(HarnessAdapter):
    name = "qwen-code"
    source = NpmPackage("@qwen-code/qwen-code", "0.24.4", "qwen")
    wire_api = "chat"
    shell_tool = ShellTool("run_shell_command", "command", wait_args={"timeout": 600000})  # ``timeout`` in ms
    noise_dirs = (".qwen",)
    prefill_allowance_s = 900.0  # ~18k first-prompt tokens
    volatile_rules = (
        # its startup context ("This is the Qwen Code. ... Today's date is Monday, November 30, 2026.")
        # and a later reminder ("The current date is: Monday, November 30, 2026. Note: ..."), both in
        # the first user message
        VolatileRule(
            "qwen-todays-date",
            frozenset({"user"}),
            re.compile(r"^Today's date is \w+, \w+ \d{1,2}, \d{4}\.\n?", re.MULTILINE),
        ),
        VolatileRule(
            "qwen-current-date",
            frozenset({"user"}),
            re.compile(r"^The current date is: \w+, \w+ \d{1,2}, \d{4}\. ?", re.MULTILINE),
        ),
    )

    def settings(self, ctx: HarnessContext) -> dict:
        return {
            "security": {"auth": {"selectedType": "openai"}, "folderTrust": {"enabled": False}},
            "model": {"name": ctx.model_name},
            "general": {
                "enableAutoUpdate": False,
                "chatRecording": False,
                "gitCoAuthor": {"commit": False, "pr": False},
            },
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
        }

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        return {f"{ctx.home}/.qwen/settings.json": json.dumps(self.settings(ctx), indent=2) + "\n"}

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {
            "OPENAI_BASE_URL": ctx.base_url,
            "OPENAI_API_KEY": ctx.session_key,
            "OPENAI_MODEL": ctx.model_name,
            "QWEN_USAGE_STATISTICS_ENABLED": "0",
            "QWEN_TELEMETRY_ENABLED": "0",
        }

    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        return [
            *self.launcher,
            "--output-format",
            "stream-json",
            "--approval-mode",
            "yolo",
            "--auth-type",
            "openai",
            "--model",
            ctx.model_name,
            prompt,
        ]

    def summarize(self, stdout: str) -> HarnessSummary:
        return stream_json_summary(stdout)  # its stream-json is Claude Code's format

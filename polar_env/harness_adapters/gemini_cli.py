"""Google Gemini CLI: the Gemini API (``generateContent``), pointed at the proxy by the environment.

``GOOGLE_GEMINI_BASE_URL`` replaces the API's root (the genai SDK appends
``/v1beta/models/<model>:streamGenerateContent?alt=sse``; plain HTTP is allowed to 127.0.0.1) and
``GEMINI_API_KEY`` is sent as ``x-goog-api-key``. Settings pick API-key auth and turn off telemetry,
usage statistics and update checks; the folder is trusted so ``--yolo`` runs every tool headless.

Agent skills are off: it lists the skills it finds (two built in, plus any in HOME or the tree) in
its system prompt and in ``activate_skill``'s description in the order an asynchronous glob returns
them, which changes between runs of one task and split its GRPO groups.
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

SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "tools": {"shell": {"enableInteractiveShell": False}},  # plain child processes: no pty in a sandbox
    "skills": {"enabled": False},  # listed in glob order, which varies run to run (see above)
}


class GeminiCliAdapter(HarnessAdapter):
    name = "gemini-cli"
    source = NpmPackage("@google/gemini-cli", "0.61.0", "gemini")
    wire_api = "gemini"
    shell_tool = ShellTool("run_shell_command", "command")
    noise_dirs = (".gemini",)
    prefill_allowance_s = 480.0  # ~11.7k first-prompt tokens
    volatile_rules = (
        # "Today's date is Monday, November 30, 2026 (formatted according to the user's locale)." in
        # the <session_context> part of its first user message
        VolatileRule(
            "gemini-todays-date",
            frozenset({"user"}),
            re.compile(
                r"^Today's date is [^\n]*\(formatted according to the user's locale\)\.\n?", re.MULTILINE
            ),
        ),
    )

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        return {f"{ctx.home}/.gemini/settings.json": json.dumps(SETTINGS, indent=2) + "\n"}

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {
            "GOOGLE_GEMINI_BASE_URL": ctx.server_root,
            "GEMINI_API_KEY": ctx.session_key,
            "GEMINI_CLI_NO_RELAUNCH": "true",  # one process: no child re-exec with a larger heap
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
            "GEMINI_TELEMETRY_ENABLED": "false",
        }

    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        return [
            *self.launcher,
            "--yolo",
            "--output-format",
            "stream-json",
            "--model",
            ctx.model_name,
            "--prompt",
            prompt,
        ]

    def summarize(self, stdout: str) -> HarnessSummary:
        """``stream-json`` events: assistant text arrives in deltas; a turn ends at a tool result or the
        end."""
        events, bad = json_lines(stdout)
        s = HarnessSummary(events=len(events), unparsed_lines=bad)
        text: str | None = None  # the assistant text of the turn in progress
        for ev in events:
            kind = ev.get("type")
            if kind == "message" and ev.get("role") == "assistant":
                if text is None:
                    s.turns += 1
                text = (text or "") + str(ev.get("content") or "")
                s.final_message = text
            elif kind == "tool_use":
                s.turns += text is None
                text = ""  # a turn that calls tools: its text, if any, came first
                s.tool_calls += 1
                s.tool_names.append(str(ev.get("tool_name")))
            elif kind == "tool_result":
                text = None
            elif kind == "error":
                s.error = str(ev.get("message") or ev.get("error"))
            elif kind == "result":
                error = ev.get("error")
                if ev.get("status") != "success" or error:
                    s.error = str(
                        (error or {}).get("message") if isinstance(error, dict) else error or ev.get("status")
                    )
                s.finished = s.error is None
        return s

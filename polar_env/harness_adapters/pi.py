"""Pi coding agent: a custom provider in ``models.json`` under its own agent dir.

Chat completions (``openai-completions``) is its default wire API; ``PI_OFFLINE=1`` turns off
every startup network operation (update checks, package checks, install telemetry).
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


def _text(message: dict) -> str | None:
    parts = [
        c.get("text", "")
        for c in message.get("content") or []
        if isinstance(c, dict) and c.get("type") == "text"
    ]
    return "".join(parts) if parts else None


class PiAdapter(HarnessAdapter):
    name = "pi"
    source = NpmPackage("@mariozechner/pi-coding-agent", "0.73.1", "pi")
    wire_api = "chat"
    shell_tool = ShellTool("bash", "command")
    noise_dirs = (".pi",)
    volatile_rules = (
        VolatileRule(
            "pi-current-date",
            frozenset({"system"}),
            re.compile(r"^Current date: \d{4}-\d{2}-\d{2}\n?", re.MULTILINE),
        ),
    )
    api = "openai-completions"

    def agent_dir(self, ctx: HarnessContext) -> str:
        return f"{ctx.home}/.pi/agent"

    def models_json(self, ctx: HarnessContext) -> dict:
        return {
            "providers": {
                PROVIDER: {
                    "baseUrl": ctx.base_url,
                    "api": self.api,
                    "apiKey": KEY_ENV,  # resolved from the environment, so the file is the same every rollout
                    "models": [{"id": ctx.model_name}],
                }
            }
        }

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        d = self.agent_dir(ctx)
        settings = {"enableInstallTelemetry": False, "quietStartup": True}
        return {
            f"{d}/models.json": json.dumps(self.models_json(ctx), indent=2) + "\n",
            f"{d}/settings.json": json.dumps(settings, indent=2) + "\n",
        }

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {
            "PI_CODING_AGENT_DIR": self.agent_dir(ctx),
            "PI_OFFLINE": "1",
            "PI_SKIP_VERSION_CHECK": "1",
            "PI_TELEMETRY": "0",
            KEY_ENV: ctx.session_key,
        }

    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        return [
            *self.launcher,
            "-p",
            "--no-session",
            "--mode",
            "json",
            "--provider",
            PROVIDER,
            "--model",
            ctx.model_name,
            prompt,
        ]

    def summarize(self, stdout: str) -> HarnessSummary:
        events, bad = json_lines(stdout)
        s = HarnessSummary(events=len(events), unparsed_lines=bad)
        for ev in events:
            kind = ev.get("type")
            if kind == "turn_end":
                s.turns += 1
            elif kind == "tool_execution_end":
                s.tool_calls += 1
                s.tool_names.append(str(ev.get("toolName")))
            elif kind == "message_end":
                msg = ev.get("message") or {}
                if msg.get("role") == "assistant":
                    s.final_message = _text(msg) or s.final_message
                    if msg.get("stopReason") == "error" or msg.get("errorMessage"):
                        s.error = str(msg.get("errorMessage") or "assistant error")
            elif kind == "agent_end":
                s.finished = s.error is None
        return s

"""Cline CLI: an ``openai-compatible`` provider in its ``providers.json``, chat completions.

The file is what ``cline auth -p openai -k <key> -b <url> -m <model>`` writes. The key has to be in
it: a run given ``--provider``/``--model``/``--key`` rewrites the file without the base URL and then
calls the vendor's default endpoint. ``--config`` keeps all of Cline's state under HOME; tools are
auto-approved by default in a prompt run (the Polar sandbox isolates). OpenAI-compatible chat
completions is its only dialect that takes an arbitrary base URL.
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

PROVIDER = "openai-compatible"


class ClineAdapter(HarnessAdapter):
    name = "cline"
    source = NpmPackage("cline", "3.0.65", "cline")
    wire_api = "chat"
    shell_tool = ShellTool("run_commands", "commands", command_is_list=True)
    noise_dirs = (".cline", ".clinerules")
    prefill_allowance_s = 480.0  # ~5.7k first-prompt tokens and 25 tools
    volatile_rules = (
        # "2. Date: 11/30/2026" in the <env> block of its system prompt
        VolatileRule(
            "cline-date",
            frozenset({"system"}),
            re.compile(r"^\d+\. Date: \d{1,2}/\d{1,2}/\d{4}\n", re.MULTILINE),
        ),
    )

    def config_dir(self, ctx: HarnessContext) -> str:
        return f"{ctx.home}/.cline"

    def providers(self, ctx: HarnessContext) -> dict:
        settings = {
            "provider": PROVIDER,
            "apiKey": ctx.session_key,
            "model": ctx.model_name,
            "baseUrl": ctx.base_url,
        }
        return {
            "version": 1,
            "lastUsedProvider": PROVIDER,
            "modes": {},
            "providers": {
                PROVIDER: {
                    "settings": settings,
                    "tokenSource": "manual",
                    "updatedAt": "1970-01-01T00:00:00.000Z",
                }
            },
        }  # required: without it
        # Cline drops the whole file and falls back to its own cloud provider

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        return {
            f"{self.config_dir(ctx)}/data/settings/providers.json": json.dumps(self.providers(ctx), indent=2)
            + "\n"
        }

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {}

    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        return [*self.launcher, "--json", "--config", self.config_dir(ctx), prompt]

    def summarize(self, stdout: str) -> HarnessSummary:
        """``--json`` lines: ``agent_event`` (iterations, tool and text content) and a final
        ``run_result``."""
        events, bad = json_lines(stdout)
        s = HarnessSummary(events=len(events), unparsed_lines=bad)
        for ev in events:
            inner = ev.get("event") or {}
            kind = inner.get("type") if ev.get("type") == "agent_event" else ev.get("type")
            if kind == "iteration_end":
                s.turns += 1
            elif kind == "content_start" and inner.get("contentType") == "tool":
                s.tool_calls += 1
                s.tool_names.append(str(inner.get("toolName")))
            elif kind == "content_end" and inner.get("contentType") == "text":
                s.final_message = inner.get("text") or s.final_message
            elif kind == "run_result":
                s.finished = ev.get("finishReason") == "completed"
                if not s.finished:
                    s.error = str(ev.get("text") or ev.get("finishReason"))
        return s

"""Nanocoder (``@nanocollective/nanocoder``, npm): chat completions through its OpenAI-compatible provider.

``$NANOCODER_CONFIG_DIR/agents.config.json`` declares one provider at the proxy (the AI SDK's
``openai-compatible`` client, its default for a provider with a ``baseUrl``), the key written as
``${POLAR_SESSION_KEY}``, which Nanocoder substitutes from the environment. ``run --json`` runs one
task without a terminal (its plain runtime) and prints one JSON report at the end: the outcome, the
final text and every tool call. ``--mode yolo`` runs every tool unasked, ``--trust-directory``
trusts ``/testbed`` for this run only.
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
from polar_env.harness_adapters.sources import NpmPackage

PROVIDER = "polar"
KEY_ENV = "POLAR_SESSION_KEY"
CONTEXT_LENGTH = 131072


class NanocoderAdapter(HarnessAdapter):
    name = "nanocoder"
    # it declares Node >= 22 (on the host's 20 it dies at start-up): the Node.js OpenClaw pins, from npm
    source = NpmPackage("@nanocollective/nanocoder", "1.30.0", "nanocoder", node="24.22.3")
    wire_api = "chat"
    shell_tool = ShellTool("execute_bash", "command")  # no time argument: a command runs at most 2 minutes
    noise_dirs = (".nanocoder",)  # its task list (.nanocoder/tasks.json) and project state
    prefill_allowance_s = 480.0  # ~6.7k first-prompt tokens (20 tools)
    volatile_rules = (
        # its "## SYSTEM INFORMATION" block: "OS Version: 6.18.44-fc-v1272" (the host's kernel) and
        # "Current Date: 2026-12-06"
        VolatileRule(
            "nanocoder-os-version", frozenset({"system"}), re.compile(r"^OS Version: [^\n]*\n", re.MULTILINE)
        ),
        VolatileRule(
            "nanocoder-current-date",
            frozenset({"system"}),
            re.compile(r"^Current Date: \d{4}-\d{2}-\d{2}\n?", re.MULTILINE),
        ),
    )

    def config_dir(self, ctx: HarnessContext) -> str:
        return f"{ctx.home}/.config/nanocoder"

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        provider = {
            "name": PROVIDER,
            "baseUrl": ctx.base_url,
            "apiKey": "${" + KEY_ENV + "}",
            "models": [ctx.model_name],
            "contextWindow": CONTEXT_LENGTH,
        }
        config = {"nanocoder": {"providers": [provider]}}
        return {f"{self.config_dir(ctx)}/agents.config.json": json.dumps(config, indent=2) + "\n"}

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"NANOCODER_CONFIG_DIR": self.config_dir(ctx), KEY_ENV: ctx.session_key}

    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        return [
            *self.launcher,
            "--provider",
            PROVIDER,
            "--model",
            ctx.model_name,
            "--mode",
            "yolo",
            "--trust-directory",
            "--json",
            "run",
            prompt,
        ]

    def summarize(self, stdout: str) -> HarnessSummary:
        """Its one JSON report (printed over several lines once the run ends): ``kind`` (``success``,
        ``error``, ``tool-approval-required``), ``finalText``, ``toolCalls`` and, on error, ``message``.
        It counts no turns."""
        start = stdout.find("{\n")
        try:
            report = json.loads(stdout[start:]) if start >= 0 else None
        except json.JSONDecodeError:
            report = None
        if not isinstance(report, dict):
            return HarnessSummary(unparsed_lines=len(stdout.splitlines()))
        calls = [c for c in report.get("toolCalls") or [] if isinstance(c, dict)]
        s = HarnessSummary(
            events=1,
            tool_calls=len(calls),
            tool_names=[str(c.get("name")) for c in calls],
            final_message=report.get("finalText") or None,
            finished=report.get("kind") == "success",
        )
        if not s.finished:
            s.error = str(report.get("message") or report.get("kind"))
        return s

"""OpenClaw (``openclaw``, npm): ``openclaw agent exec``, its one-shot headless turn, with a pinned config.

Its custom provider speaks chat completions (``openai-completions``, the adapter for any
OpenAI-compatible server) and always streams. ``--config`` pins the run to a file Polar writes
(``models.mode: replace``: no plugin catalogs; update checks and telemetry off), so nothing of the
machine's own OpenClaw state applies; the key is ``${POLAR_SESSION_KEY}``, expanded from the
environment. OpenClaw 2026.9 needs Node.js >= 24.16, newer than the host's, so its source pins one.

What it sends that a proxy must know:
- its task message opens with the minute it was sent (``[Thu 2026-12-03 14:28 UTC] ``) and carries a
  ``Runtime:`` line with a random session id, the host name and kernel; its system prompt has the date
  and time zone: all normalised (``volatile_rules``), so one task's samples form one GRPO group;
- after the last message of every call it appends a fresh runtime-context message (active
  background commands, sub-agents) between ``<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>`` markers, moved
  to the new end on the next call. Kept, no call would extend the previous one and every call would
  be a chain of its own; the proxy drops it, so an episode is one chain. What it says the model
  also reads from the ``exec`` tool's own results ("Command still running (session ...)").
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
USER, SYSTEM = frozenset({"user"}), frozenset({"system"})


class OpenClawAdapter(HarnessAdapter):
    name = "openclaw"
    source = NpmPackage("openclaw", "2026.9.6", "openclaw", node="24.22.3")
    wire_api = "chat"
    prefill_allowance_s = 480.0  # ~6k first-prompt tokens (11 tools, a 25.6k-character system prompt)
    # ``exec`` moves a command to the background after ``yieldMs`` (10 s) and kills it after
    # ``timeoutSeconds`` (1800 s): a long command waits in the foreground instead
    shell_tool = ShellTool("exec", "command", wait_args={"yieldMs": 3_600_000, "timeoutSeconds": 3600})
    volatile_rules = (
        VolatileRule(
            "openclaw-message-time",
            USER,
            re.compile(r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \d{4}-\d{2}-\d{2} \d{2}:\d{2}(?: [^\]\n]+)?\] "),
        ),
        VolatileRule("openclaw-runtime-line", USER, re.compile(r"\n*^Runtime: agent=[^\n]*", re.MULTILINE)),
        VolatileRule(
            "openclaw-date-and-time-zone",
            SYSTEM,
            re.compile(
                r"(?<=## Temporal Context\n)(?:Current date: \d{4}-\d{2}-\d{2}\n)?Time zone: [^\n]*\n?"
            ),
        ),
        VolatileRule(
            "openclaw-runtime-context",
            USER,
            re.compile(
                r"<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>.*?<<<END_OPENCLAW_INTERNAL_CONTEXT>>>\s*", re.DOTALL
            ),
        ),
    )

    def config_path(self, ctx: HarnessContext) -> str:
        return f"{ctx.home}/.openclaw/polar.json"

    def config(self, ctx: HarnessContext) -> dict:
        model = {
            "id": ctx.model_name,
            "name": ctx.model_name,
            "reasoning": False,
            "input": ["text"],
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
            "contextWindow": 131072,
            "maxTokens": 4096,
        }
        provider = {
            "baseUrl": ctx.base_url,
            "api": "openai-completions",
            "apiKey": f"${{{KEY_ENV}}}",
            "timeoutSeconds": 3600,
            "models": [model],
        }  # a CPU model prefills for minutes
        return {
            "update": {"checkOnStart": False},
            "telemetry": {"enabled": False},
            "models": {"mode": "replace", "providers": {PROVIDER: provider}},
        }

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        return {self.config_path(ctx): json.dumps(self.config(ctx), indent=2) + "\n"}

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {
            KEY_ENV: ctx.session_key,
            "OPENCLAW_NO_AUTO_UPDATE": "1",
            "OPENCLAW_LOG_LEVEL": "error",
            "NO_COLOR": "1",
        }

    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        # --timeout 0: Polar's episode deadline is the one limit
        return [
            *self.launcher,
            "agent",
            "exec",
            "--config",
            self.config_path(ctx),
            "--cwd",
            ctx.workdir,
            "--json",
            "--model",
            f"{PROVIDER}/{ctx.model_name}",
            "--timeout",
            "0",
            prompt,
        ]

    def summarize(self, stdout: str) -> HarnessSummary:
        """Its ``--json`` envelope: one JSON object, pretty-printed, the last thing on stdout."""
        start = stdout.rfind("\n{")
        try:
            envelope = json.loads(stdout[start + 1 :] if start >= 0 else stdout)
        except json.JSONDecodeError:
            return HarnessSummary(unparsed_lines=len(stdout.splitlines()))
        if not isinstance(envelope, dict):
            return HarnessSummary(unparsed_lines=len(stdout.splitlines()))
        tools = envelope.get("toolSummary") or {}
        error = envelope.get("error") or {}
        return HarnessSummary(
            events=1,
            turns=int(envelope.get("assistantTurns") or 0),
            tool_calls=int(tools.get("calls") or 0),
            tool_names=[str(t) for t in tools.get("tools") or []],
            final_message=envelope.get("final") or None,
            finished=envelope.get("status") == "ok" and bool(envelope.get("ok")),
            error=None
            if envelope.get("ok")
            else str(error.get("message") or envelope.get("status") or "failed"),
        )

"""Anthropic Claude Code: Messages API, configured only through the environment.

Every model tier, the sub-agent model and the small/fast model point at the served model, so
no call can ask for a model the backend does not serve; ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC``
is the one switch that removes all outside lookups and the title-generation call.
"""

from __future__ import annotations

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

MODEL_VARS = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
)


class ClaudeCodeAdapter(HarnessAdapter):
    name = "claude-code"
    source = NpmPackage("@anthropic-ai/claude-code", "2.1.332", "claude")
    wire_api = "messages"
    shell_tool = ShellTool("Bash", "command", wait_args={"timeout": 600000})
    noise_dirs = (".claude",)
    prefill_allowance_s = 480.0  # ~12.8k first-prompt tokens
    volatile_rules = (
        # "x-anthropic-billing-header: cc_version=2.1.197.66a; cc_entrypoint=sdk-cli;" as the first
        # system block; the version suffix changes per request.
        VolatileRule(
            "x-anthropic-billing-header",
            frozenset({"system"}),
            re.compile(r"^x-anthropic-billing-header:[^\n]*(?:\n+|$)", re.MULTILINE),
        ),
        # the look-behind starts a match only at the first newline of a run: without it, every
        # newline of a long blank run retries the run (quadratic: minutes for a 1 MB tool output)
        VolatileRule(
            "claude-todays-date",
            frozenset({"system", "user"}),
            re.compile(r"(?<!\n)\n*Today's date is \d{4}-\d{2}-\d{2}\.", re.MULTILINE),
        ),
        VolatileRule(
            "claude-date-line",
            frozenset({"system"}),
            re.compile(r"^Date: \d{4}-\d{2}-\d{2}\n?", re.MULTILINE),
        ),
        # " - OS Version: Linux 6.18.44-fc-v669" in its "# Environment" message: the host's kernel
        # (uname -r), which no sandbox can hide; the OS name stays.
        VolatileRule(
            "claude-os-version",
            frozenset({"system", "user"}),
            re.compile(r"^( *- )?OS Version: (\w+) [^\n]*$", re.MULTILINE),
            r"\1OS Version: \2",
        ),
    )

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        return {}

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        env = {
            "ANTHROPIC_BASE_URL": ctx.server_root,  # Claude Code appends /v1/messages itself
            "ANTHROPIC_API_KEY": ctx.session_key,
            "CLAUDE_CONFIG_DIR": f"{ctx.home}/.claude",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
        }
        env.update({var: ctx.model_name for var in MODEL_VARS})
        if ctx.as_root:
            env["IS_SANDBOX"] = "1"  # --dangerously-skip-permissions refuses root otherwise
        return env

    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        return [
            *self.launcher,
            "-p",
            "--dangerously-skip-permissions",
            "--output-format",
            "stream-json",
            "--verbose",
            "--model",
            ctx.model_name,
            prompt,
        ]

    def summarize(self, stdout: str) -> HarnessSummary:
        return stream_json_summary(stdout)


def stream_json_summary(stdout: str) -> HarnessSummary:
    """Claude Code's ``stream-json`` events (``assistant`` messages with ``tool_use`` blocks, a final
    ``result``); Qwen Code writes the same format."""
    events, bad = json_lines(stdout)
    s = HarnessSummary(events=len(events), unparsed_lines=bad)
    assistant_turns = 0
    for ev in events:
        kind = ev.get("type")
        if kind == "assistant":
            assistant_turns += 1
            for block in (ev.get("message") or {}).get("content") or []:
                if block.get("type") == "tool_use":
                    s.tool_calls += 1
                    s.tool_names.append(str(block.get("name")))
                elif block.get("type") == "text":
                    s.final_message = block.get("text")
        elif kind == "result":
            s.turns = int(ev.get("num_turns") or assistant_turns)
            s.finished = ev.get("subtype") == "success" and not ev.get("is_error")
            if isinstance(ev.get("result"), str):
                s.final_message = ev["result"]
            if not s.finished:
                s.error = str(ev.get("result") or ev.get("subtype"))
    if not s.turns:
        s.turns = assistant_turns
    return s

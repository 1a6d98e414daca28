"""Hermes Agent (``hermes-agent``, PyPI): streamed chat completions to a ``custom`` provider, its ``terminal``
tool.

Everything it reads lives under ``HERMES_HOME``: ``config.yaml`` makes the proxy its ``custom``
OpenAI-compatible provider (base URL, served model, and the key as ``${POLAR_SESSION_KEY}``, which
Hermes expands from the environment, so the file is the same every rollout). ``context_length``
spares it probing the server for the window, and ``supports_vision: false`` (a text model) its
keyless probe for Ollama's vision support. The side calls it would make on its own are off: the
session-title request after the first answer (a second chain in the trajectory), and the download
of its ``tirith`` command scanner and of lazily installed tool dependencies (no network in the
sandbox). ``chat -q`` runs one query headless and exits; ``--yolo`` runs commands without asking.
"""

from __future__ import annotations

import json
import re
import textwrap

from polar_env.harness_adapters.base import (
    HarnessAdapter,
    HarnessContext,
    HarnessSummary,
    ShellTool,
    VolatileRule,
)
from polar_env.harness_adapters.sources import PythonVenv

KEY_ENV = "POLAR_SESSION_KEY"
CONTEXT_LENGTH = 131072
# a finished tool call, as its console prints it: "┊ 💻 $         <command>  0.1s" (a failure gets
# " [exit 1]")
TOOL_LINE = re.compile(r"^ *┊ \S+ +(\S+) .*?\d+\.\d+s(?: \[[^\n]*\])?$", re.MULTILINE)
VERBS = {"$": "terminal", "read": "read_file", "write": "write_file", "patch": "patch", "proc": "process"}
# its answer: streamed into a box ("╭─ ⚕ Hermes ───╮", the text indented 4, "╰───╯"), or, when nothing
# was streamed (an API failure's message), a rule-framed panel (" ─  ⚕ Hermes  ─── ", padded lines, " ─── ")
ANSWER = re.compile(
    r"^(?:╭─ [^\n]*Hermes[^\n]*╮|\s─  [^\n]*Hermes  ─+\s*)\n(.*?)^(?:╰─+╯|\s─+\s*)$", re.MULTILINE | re.DOTALL
)
# why a run gave up: "❌ Non-retryable error (HTTP 400): ...", "❌ API failed after 3 retries — ..."
FAILURE = re.compile(r"^❌ (.*)$", re.MULTILINE)
# the exit summary: "Messages:       4 (1 user, 2 tool calls)" (tool calls: tool results + assistant turns
# with calls)
MESSAGES = re.compile(r"^Messages: +(\d+) \((\d+) user, (\d+) tool calls\)$", re.MULTILINE)


class HermesAgentAdapter(HarnessAdapter):
    name = "hermes-agent"
    source = PythonVenv("hermes-agent", "0.19.0", "hermes", lock="hermes-agent.txt")
    wire_api = "chat"
    shell_tool = ShellTool("terminal", "command", wait_args={"timeout": 600})  # ``timeout`` in s, at most 600
    prefill_allowance_s = 900.0  # ~15k first-prompt tokens (its default toolset: 25 tools for a text model)
    volatile_rules = (
        # "Conversation started: Monday, November 30, 2026" near the end of its system prompt
        VolatileRule(
            "hermes-conversation-date",
            frozenset({"system"}),
            re.compile(r"^Conversation started: \w+, \w+ \d{1,2}, \d{4}\n?", re.MULTILINE),
        ),
        # "Host: Linux (6.18.44-fc-v669)": the host's kernel (platform.release()); the OS name stays
        VolatileRule(
            "hermes-host-kernel",
            frozenset({"system"}),
            re.compile(r"^Host: (\w+) \([^)\n]*\)$", re.MULTILINE),
            r"Host: \1",
        ),
    )

    def hermes_home(self, ctx: HarnessContext) -> str:
        return f"{ctx.home}/.hermes"

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        config = {
            "model": {
                "provider": "custom",
                "base_url": ctx.base_url,
                "api_key": "${" + KEY_ENV + "}",
                "default": ctx.model_name,
                "context_length": CONTEXT_LENGTH,
                "supports_vision": False,
            },
            "auxiliary": {"title_generation": {"enabled": False}},
            "security": {"tirith_enabled": False, "allow_lazy_installs": False},
        }
        return {
            f"{self.hermes_home(ctx)}/config.yaml": json.dumps(config, indent=2) + "\n"
        }  # JSON is valid YAML

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"HERMES_HOME": self.hermes_home(ctx), KEY_ENV: ctx.session_key}

    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        return [*self.launcher, "chat", "--yolo", "-q", prompt]

    def summarize(self, stdout: str) -> HarnessSummary:
        """Read its console: a line per finished tool call, the answer box, a ``❌`` line when it gave up
        on the API, and the exit summary, whose message count gives the assistant turns."""
        stdout = stdout.replace("\r\n", "\n")  # what prompt_toolkit prints ends its lines with \r\n
        tools: list[str] = TOOL_LINE.findall(stdout)
        answers = ANSWER.findall(stdout)
        totals = MESSAGES.findall(stdout)
        failures = FAILURE.findall(stdout)
        s = HarnessSummary(
            tool_calls=len(tools),
            tool_names=[VERBS.get(v, v) for v in tools],
            events=len(tools) + len(answers) + len(totals) + len(failures),
        )
        if answers:
            lines = textwrap.dedent(answers[-1]).splitlines()
            s.final_message = "\n".join(line.rstrip() for line in lines).strip() or None
        s.error = failures[0].strip() if failures else None
        if totals:
            messages, users, _ = (int(n) for n in totals[-1])
            s.turns = messages - users - len(tools)  # everything else is an assistant message
        s.finished = bool(totals) and s.error is None
        return s

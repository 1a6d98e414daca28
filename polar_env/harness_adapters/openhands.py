"""OpenHands (the ``openhands`` CLI, PyPI, on the OpenHands SDK): chat completions through LiteLLM.

Every OpenHands distribution needs Python >= 3.12 (the CLI: ``==3.12.*``), newer than the sandbox's
Debian 3.11, so it installs into a portable copy of a host CPython 3.12 (``PortablePython``).
``--headless`` runs the task with every action approved, ``--json`` streams its events as JSON
lines, and ``--override-with-envs`` builds its agent from ``LLM_MODEL`` / ``LLM_BASE_URL`` /
``LLM_API_KEY`` instead of a saved profile (nothing is persisted). Its tools require a
``security_risk`` argument on every call, so the shell tool declares it. A reply without a tool
call ends the run (as its ``finish`` tool does).
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
from polar_env.harness_adapters.sources import PortablePython

SYSTEM = frozenset({"system"})


class OpenHandsAdapter(HarnessAdapter):
    name = "openhands"
    source = PortablePython("openhands", "1.16.0", "openhands", python="3.12", lock="openhands.txt")
    wire_api = "chat"
    # ``timeout`` in s: without it a command silent for 10 s returns as "still running"
    shell_tool = ShellTool(
        "terminal", "command", extra_args={"security_risk": "LOW"}, wait_args={"timeout": 600}
    )
    volatile_rules = (
        # "<CURRENT_DATETIME>\nThe current date and time is: 2026-11-30T18:44:50.295845\n</CURRENT_DATETIME>"
        VolatileRule(
            "openhands-current-datetime",
            SYSTEM,
            re.compile(r"^The current date and time is: \d{4}-\d{2}-\d{2}T[\d:.]+\n?", re.MULTILINE),
        ),
        # "User operating system: Linux (kernel 6.18.44-fc-v669)": the host's kernel
        VolatileRule(
            "openhands-os-kernel",
            SYSTEM,
            re.compile(r"^(User operating system: \w+) \(kernel [^)\n]*\)", re.MULTILINE),
            r"\1",
        ),
    )
    prefill_allowance_s = 240.0  # ~6k first-prompt tokens (six tools, a 13.7k-character system prompt)

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {
            "LLM_MODEL": f"openai/{ctx.model_name}",
            "LLM_BASE_URL": ctx.base_url,
            "LLM_API_KEY": ctx.session_key,
            "OPENHANDS_SUPPRESS_BANNER": "1",
            # LiteLLM fetches its model price list at import unless told to use the bundled copy
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        return {}  # the environment carries everything (--override-with-envs)

    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        return [*self.launcher, "--headless", "--json", "--override-with-envs", "-t", prompt]

    def summarize(self, stdout: str) -> HarnessSummary:
        """Its JSON events (between plain console lines): ``ActionEvent`` per tool call, an agent
        ``MessageEvent`` as the final message, one ``llm_response_id`` per model turn, and
        ``AgentErrorEvent`` / ``ConversationErrorEvent`` as failures."""
        events, bad = json_lines(stdout)
        s = HarnessSummary(events=len(events), unparsed_lines=bad)
        responses: set[str] = set()
        for ev in events:
            kind = ev.get("kind")
            if ev.get("source") == "agent" and ev.get("llm_response_id"):
                responses.add(ev["llm_response_id"])
            if kind == "ActionEvent":
                s.tool_calls += 1
                s.tool_names.append(str(ev.get("tool_name")))
                if ev.get("tool_name") == "finish":
                    s.final_message = str((ev.get("action") or {}).get("message") or s.final_message)
            elif kind == "MessageEvent" and ev.get("source") == "agent":
                parts = (ev.get("llm_message") or {}).get("content") or []
                s.final_message = (
                    "".join(p.get("text", "") for p in parts if isinstance(p, dict)) or s.final_message
                )
            elif kind == "ConversationErrorEvent":
                s.error = str(ev.get("detail") or ev.get("code") or ev)
        s.turns = len(responses)
        s.finished = s.turns > 0 and s.error is None
        return s

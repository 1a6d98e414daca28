"""Mistral Vibe (``mistral-vibe``, PyPI): chat completions through its ``generic`` OpenAI-style provider.

Vibe 3 is a Rust client (``vibe/_bin/vibe-rs``, shipped in the wheel) that starts its Python agent
(``vibe-app-server``) as a child over stdio. It needs Python >= 3.12, so it installs into a portable
CPython 3.12 (``PortablePython``). The ``vibe`` console script only execs the Rust client with the
app server's path; that script's ``#!`` names the host path of the install, which the sandbox does
not have, so the adapter runs the Rust client itself and names the app server by
``VIBE_APP_SERVER_CMD`` (its documented override), run through the mounted interpreter.

Everything else is ``$VIBE_HOME/config.toml``: one provider at the proxy (key from
``POLAR_SESSION_KEY``), one model, telemetry, update checks and session titles off.
``-p --output streaming --auto-approve --trust`` runs one task headless, printing its messages
as JSON lines.
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
from polar_env.harness_adapters.sources import HARNESS_MOUNT, PortablePython

KEY_ENV = "POLAR_SESSION_KEY"
PROVIDER = "polar"
CONTEXT_LENGTH = 131072


def _toml(value: object) -> str:
    """A TOML value (strings, booleans, integers): JSON's string escapes are TOML's basic strings'."""
    return str(value).lower() if isinstance(value, bool) else json.dumps(value)


SOURCE = PortablePython("mistral-vibe", "3.0.2", "vibe", python="3.12", lock="mistral-vibe.txt")


class MistralVibeAdapter(HarnessAdapter):
    name = "mistral-vibe"
    source = SOURCE
    wire_api = "chat"
    shell_tool = ShellTool(
        "bash", "command", wait_args={"timeout_seconds": 300}
    )  # 120 s by default, at most 300
    noise_dirs = (".vibe",)
    prefill_allowance_s = 480.0  # ~8.5k first-prompt tokens (10 tools, an 18.4k-character system prompt)
    volatile_rules = (
        # "Today's date is 2026-12-06 (Sunday)." after its persona line in the system prompt
        VolatileRule(
            "vibe-todays-date",
            frozenset({"system"}),
            re.compile(r"^Today's date is \d{4}-\d{2}-\d{2} \(\w+\)\.\n?", re.MULTILINE),
        ),
    )

    @property
    def launcher(self) -> list[str]:
        """The Rust client the ``vibe`` script execs (that script's ``#!`` is a host path)."""
        return [f"{HARNESS_MOUNT}/lib/python{SOURCE.python}/site-packages/vibe/_bin/vibe-rs"]

    def vibe_home(self, ctx: HarnessContext) -> str:
        return f"{ctx.home}/.vibe"

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        top = {
            "active_model": ctx.model_name,
            "enable_telemetry": False,
            "enable_update_checks": False,
            "enable_auto_update": False,
            "enable_notifications": False,
        }
        provider = {
            "name": PROVIDER,
            "api_base": ctx.base_url,
            "api_key_env_var": KEY_ENV,
            "api_style": "openai",
            "backend": "generic",
        }
        model = {
            "name": ctx.model_name,
            "provider": PROVIDER,
            "alias": ctx.model_name,
            "max_context_length": CONTEXT_LENGTH,
        }
        lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
        lines += ["", "[[providers]]", *(f"{k} = {_toml(v)}" for k, v in provider.items())]
        lines += ["", "[[models]]", *(f"{k} = {_toml(v)}" for k, v in model.items())]
        return {f"{self.vibe_home(ctx)}/config.toml": "\n".join(lines) + "\n"}

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        interpreter = f"{HARNESS_MOUNT}/{SOURCE.interpreter}"
        return {
            "VIBE_HOME": self.vibe_home(ctx),
            KEY_ENV: ctx.session_key,
            "VIBE_APP_SERVER_CMD": f"{interpreter} {HARNESS_MOUNT}/bin/vibe-app-server",
        }

    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        return [*self.launcher, "--output", "streaming", "--auto-approve", "--trust", "-p", prompt]

    def summarize(self, stdout: str) -> HarnessSummary:
        """Its session entries, one a line: ``effect`` = a tool call (``file_system.bash``), an assistant
        ``message`` = its text; a model turn is an assistant message or a run of tool calls between them."""
        events, bad = json_lines(stdout)
        s = HarnessSummary(events=len(events), unparsed_lines=bad)
        in_tools = False
        for ev in events:
            if ev.get("type") == "effect":
                s.tool_calls += 1
                s.tool_names.append(
                    str((ev.get("detail") or {}).get("toolName", ev.get("title"))).rsplit(".", 1)[-1]
                )
                s.turns += not in_tools
                in_tools = True
            elif ev.get("type") == "message" and ev.get("role") == "assistant":
                text = "".join(p.get("text", "") for p in ev.get("content") or [] if isinstance(p, dict))
                s.final_message = text or s.final_message
                s.turns += 1
                in_tools = False
            if ev.get("generationStatus") == "failed" or (ev.get("outcome") or {}).get("type") == "failed":
                s.error = json.dumps(ev.get("outcome") or ev.get("generationStatus"))
        s.finished = s.turns > 0 and s.error is None
        return s

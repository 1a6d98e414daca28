"""Kimi CLI (``kimi-cli``, PyPI): chat completions through its ``openai_legacy`` provider.

It needs Python >= 3.12, so it installs into a portable CPython (``PortablePython``), 3.13: on
CPython 3.12.1 every run dies at start-up (``SlashCommand[F](...)``, a frozen slotted generic
dataclass, raises ``TypeError`` when ``typing`` sets its ``__orig_class__``). Pinned at 1.51.0: the
package's last release (1.52.0) is a tombstone that only prints where its successor is.
``$KIMI_SHARE_DIR/config.json`` (passed with ``--config-file``) names one model on one
``openai_legacy`` provider (its type for any OpenAI-compatible server) at the proxy, telemetry off;
the key comes from ``OPENAI_API_KEY``, which that provider type reads over the file's.
``--print --output-format stream-json --yolo`` runs one task headless with every tool approved and
prints each message as a JSON line.
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
    chat_messages_summary,
)
from polar_env.harness_adapters.sources import PortablePython

PROVIDER = "polar"
CONTEXT_LENGTH = 131072


class KimiCliAdapter(HarnessAdapter):
    name = "kimi-cli"
    source = PortablePython("kimi-cli", "1.51.0", "kimi", python="3.13", lock="kimi-cli.txt")
    wire_api = "chat"
    # ``timeout`` in s: 60 by default, at most 300 for a command in the foreground
    shell_tool = ShellTool("Shell", "command", wait_args={"timeout": 300})
    prefill_allowance_s = 480.0  # ~12.3k first-prompt tokens (15 tools, a 14.8k-character system prompt)
    volatile_rules = (
        # "The current date and time in ISO format is `2026-12-06T21:28:45.458865+00:00`. This is only a
        # reference ...": its clock in the sandbox's time zone, in the "## Date and Time" section
        VolatileRule(
            "kimi-current-datetime",
            frozenset({"system"}),
            re.compile(r"^The current date and time in ISO format is `[\d\-T:.+]+`\. ", re.MULTILINE),
        ),
    )

    def share_dir(self, ctx: HarnessContext) -> str:
        return f"{ctx.home}/.kimi"

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        config = {
            "default_model": ctx.model_name,
            "telemetry": False,
            "providers": {PROVIDER: {"type": "openai_legacy", "base_url": ctx.base_url, "api_key": ""}},
            "models": {
                ctx.model_name: {
                    "provider": PROVIDER,
                    "model": ctx.model_name,
                    "max_context_size": CONTEXT_LENGTH,
                }
            },
        }
        return {f"{self.share_dir(ctx)}/config.json": json.dumps(config, indent=2) + "\n"}

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"KIMI_SHARE_DIR": self.share_dir(ctx), "OPENAI_API_KEY": ctx.session_key}

    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        return [
            *self.launcher,
            "--config-file",
            f"{self.share_dir(ctx)}/config.json",
            "--print",
            "--output-format",
            "stream-json",
            "--yolo",
            "-p",
            prompt,
        ]

    def summarize(self, stdout: str) -> HarnessSummary:
        """Its messages, one a line. A failure prints a plain text line, no message, and exits non-zero
        (75 when the server cannot be reached)."""
        return chat_messages_summary(stdout)

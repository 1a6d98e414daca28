"""Kilo CLI (``@kilocode/cli``, npm): OpenCode's fork, configured as OpenCode is (opencode.py).

Its config is ``~/.config/kilo/kilo.json`` in OpenCode's schema (the same custom
``@ai-sdk/openai-compatible`` provider, bundled in its binary), its switches are OpenCode's under
``KILO_``, and it runs headless as ``kilo run --format json``, printing OpenCode's events. What it
adds over OpenCode calls out, so it is off as well: its background daemon (``KILO_NO_DAEMON``: each
run is its own process), PostHog telemetry, session ingest into its cloud and presence events.
Besides OpenCode's date line it stamps each user message with the second it was sent.
"""

from __future__ import annotations

import re

from polar_env.harness_adapters.base import HarnessContext, VolatileRule
from polar_env.harness_adapters.opencode import OFFLINE_SWITCHES, OpenCodeAdapter
from polar_env.harness_adapters.sources import NpmPackage


class KiloAdapter(OpenCodeAdapter):
    name = "kilo"
    # 7.7.7: the newest release whose per-platform binary (@kilocode/cli-linux-x64) npm carries
    source = NpmPackage("@kilocode/cli", "7.7.7", "kilo")
    noise_dirs = (".kilo",)
    prefill_allowance_s = 480.0  # ~12.3k first-prompt tokens (15 tools, a 13.6k-character system prompt)
    config_name = "kilo"
    env_prefix = "KILO"
    offline_switches = (*OFFLINE_SWITCHES, "DISABLE_SESSION_INGEST", "DISABLE_PRESENCE", "NO_DAEMON")
    volatile_rules = (
        *OpenCodeAdapter.volatile_rules,  # its <env> block keeps OpenCode's "  Today's date: Mon Nov 30 2026"
        # "Message time: 2026-12-06T20:27:41Z", first line of the <environment_details> after its task
        VolatileRule(
            "kilo-message-time",
            frozenset({"user"}),
            re.compile(r"^Message time: \d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z\n", re.MULTILINE),
        ),
    )

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {**super().env(ctx), "KILO_TELEMETRY_LEVEL": "off"}

    def config(self, ctx: HarnessContext) -> dict:
        return {**super().config(ctx), "snapshot": False}

"""Name -> adapter. Adding a harness = one module with a HarnessAdapter subclass + one line here."""

from __future__ import annotations

from polar_env.harness_adapters.base import HarnessAdapter
from polar_env.harness_adapters.claude_code import ClaudeCodeAdapter
from polar_env.harness_adapters.codex import CodexAdapter
from polar_env.harness_adapters.pi import PiAdapter

ADAPTERS: dict[str, type[HarnessAdapter]] = {
    "codex": CodexAdapter,
    "claude-code": ClaudeCodeAdapter,
    "pi": PiAdapter,
}
ALIASES = {"claude_code": "claude-code", "claude": "claude-code"}


def get_adapter(name: str) -> HarnessAdapter:
    key = ALIASES.get(name, name)
    if key not in ADAPTERS:
        raise KeyError(f"unknown harness {name!r}; known: {', '.join(sorted(ADAPTERS))}")
    return ADAPTERS[key]()


def adapter_names() -> list[str]:
    return list(ADAPTERS)

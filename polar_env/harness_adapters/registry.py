"""Name -> adapter. Adding a harness = one module with a HarnessAdapter subclass + one line here.

What Polar needs from every harness at once (the proxy and the grader do not know which harness a
session runs) is the union over this table: noise dirs here, volatile lines in proxy/volatile.py,
shell tools, text edit formats and finish commands in harness_adapters/policies.py.
"""

from __future__ import annotations

from polar_env.harness_adapters.aider import AiderAdapter
from polar_env.harness_adapters.base import HarnessAdapter, ShellTool, TextEdit
from polar_env.harness_adapters.claude_code import ClaudeCodeAdapter
from polar_env.harness_adapters.cline import ClineAdapter
from polar_env.harness_adapters.codex import CodexAdapter
from polar_env.harness_adapters.gemini_cli import GeminiCliAdapter
from polar_env.harness_adapters.hermes_agent import HermesAgentAdapter
from polar_env.harness_adapters.kilo import KiloAdapter
from polar_env.harness_adapters.kimi_cli import KimiCliAdapter
from polar_env.harness_adapters.mini_swe_agent import MiniSweAgentAdapter
from polar_env.harness_adapters.mistral_vibe import MistralVibeAdapter
from polar_env.harness_adapters.nanocoder import NanocoderAdapter
from polar_env.harness_adapters.openclaw import OpenClawAdapter
from polar_env.harness_adapters.opencode import OpenCodeAdapter
from polar_env.harness_adapters.openhands import OpenHandsAdapter
from polar_env.harness_adapters.pi import PiAdapter
from polar_env.harness_adapters.qwen_code import QwenCodeAdapter
from polar_env.sandbox.base import BUILD_EXCLUDES

ADAPTERS: dict[str, type[HarnessAdapter]] = {
    "codex": CodexAdapter,
    "claude-code": ClaudeCodeAdapter,
    "pi": PiAdapter,
    "gemini-cli": GeminiCliAdapter,
    "mini-swe-agent": MiniSweAgentAdapter,
    "aider": AiderAdapter,
    "qwen-code": QwenCodeAdapter,
    "opencode": OpenCodeAdapter,
    "cline": ClineAdapter,
    "hermes-agent": HermesAgentAdapter,
    "openhands": OpenHandsAdapter,
    "openclaw": OpenClawAdapter,
    "kilo": KiloAdapter,
    "mistral-vibe": MistralVibeAdapter,
    "kimi-cli": KimiCliAdapter,
    "nanocoder": NanocoderAdapter,
}
ALIASES = {
    "claude_code": "claude-code",
    "claude": "claude-code",
    "gemini_cli": "gemini-cli",
    "gemini": "gemini-cli",
    "mini_swe_agent": "mini-swe-agent",
    "hermes_agent": "hermes-agent",
    "hermes": "hermes-agent",
    "kilocode": "kilo",
    "mistral_vibe": "mistral-vibe",
    "vibe": "mistral-vibe",
    "kimi_cli": "kimi-cli",
    "kimi": "kimi-cli",
}

# Every harness's state dirs and the build artefacts: never part of an agent's patch (docs/rewards.md).
NOISE_EXCLUDES: tuple[str, ...] = tuple(
    dict.fromkeys([d for adapter in ADAPTERS.values() for d in adapter.noise_dirs] + list(BUILD_EXCLUDES))
)


def get_adapter(name: str) -> HarnessAdapter:
    key = ALIASES.get(name, name)
    if key not in ADAPTERS:
        raise KeyError(f"unknown harness {name!r}; known: {', '.join(sorted(ADAPTERS))}")
    return ADAPTERS[key]()


def adapter_names() -> list[str]:
    return list(ADAPTERS)


def harness_choices() -> list[str]:
    """Every name ``get_adapter`` accepts (aliases included), for command-line choices."""
    return [*ADAPTERS, *ALIASES]


def shell_tools() -> list[ShellTool]:
    """Each harness's shell tool, in registry order."""
    return [adapter.shell_tool for adapter in ADAPTERS.values() if adapter.shell_tool is not None]


def text_edits() -> list[TextEdit]:
    """Each text-editing harness's edit format, in registry order."""
    return [adapter.text_edit for adapter in ADAPTERS.values() if adapter.text_edit is not None]


def finish_commands() -> list[str]:
    """Each harness's finish command (for the harnesses that end only by running one)."""
    return [adapter.finish_command for adapter in ADAPTERS.values() if adapter.finish_command is not None]

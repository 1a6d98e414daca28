"""What every harness adapter declares: install source, config, env, command line, shell tool, noise
dirs, volatile prompt lines, summary parser.

An adapter is data plus four small functions; the runner (runner.py) does the rest. Installs
live in one shared cache (``$POLAR_CACHE`` or ``~/.cache/polar``) as
``harnesses/<name>-<version>`` and are mounted read-only at /opt/harness in every sandbox (sources.py).
Nothing here is per-rollout except the session id and key, which never reach the prompt.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from polar_env.cache import cache_root
from polar_env.harness_adapters import sources
from polar_env.harness_adapters.sources import InstallSource


@dataclass(frozen=True)
class HarnessContext:
    """What an adapter needs to point its harness at the proxy, as seen inside the sandbox."""

    session_id: str
    session_key: str
    model_name: str
    port: int
    home: str = "/home/agent"
    workdir: str = "/testbed"
    as_root: bool = False

    @property
    def server_root(self) -> str:
        """The session's URL root; the proxy routes by the ``/s/<id>`` prefix."""
        return f"http://127.0.0.1:{self.port}/s/{self.session_id}"

    @property
    def base_url(self) -> str:
        return f"{self.server_root}/v1"


@dataclass
class HarnessSummary:
    """What the harness's own event stream says about the episode (turns as the harness counts them)."""

    turns: int = 0
    tool_calls: int = 0
    final_message: str | None = None
    finished: bool = False  # the stream's final event said the run completed
    error: str | None = None
    events: int = 0
    unparsed_lines: int = 0
    tool_names: list[str] = field(default_factory=list)


def json_lines(stdout: str) -> tuple[list[dict], int]:
    """Parse a JSONL event stream, tolerating a cut first line (tails) and stray log lines."""
    events, bad = [], 0
    for line in stdout.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(obj, dict):
            events.append(obj)
        else:
            bad += 1
    return events, bad


def chat_messages_summary(stdout: str) -> HarnessSummary:
    """A conversation printed as OpenAI-style messages, one JSON line each (Kimi CLI, Grok CLI): each
    assistant message is a model turn, its ``tool_calls`` the tool calls, the last one's text (a string
    or text parts) the final message."""
    events, bad = json_lines(stdout)
    s = HarnessSummary(events=len(events), unparsed_lines=bad)
    for ev in events:
        if ev.get("role") != "assistant":
            continue
        s.turns += 1
        for call in ev.get("tool_calls") or []:
            s.tool_calls += 1
            s.tool_names.append(str((call.get("function") or {}).get("name")))
        content = ev.get("content")
        text = (
            content
            if isinstance(content, str)
            else "".join(
                p.get("text", "") for p in content or [] if isinstance(p, dict) and p.get("type") == "text"
            )
        )
        s.final_message = text or s.final_message
    s.finished = s.turns > 0
    return s


@dataclass(frozen=True)
class VolatileRule:
    """A line the harness writes into its prompt that differs between rollouts of one task (the date,
    the host's kernel, a per-request hash): the proxy rewrites every match to ``replacement`` in
    messages of ``roles``, so GRPO groups, keyed on first-prompt ids, span days and machines."""

    name: str
    roles: frozenset[str]  # the canonical roles the rule applies to
    pattern: re.Pattern[str]
    replacement: str = ""  # what a match becomes (default: removed)


@dataclass(frozen=True)
class ShellTool:
    """The harness's own shell tool as the model sees it, so a scripted policy (harness_adapters/policies.py)
    can call it: ``{name: {command_arg: <command>}}`` (``[<command>]`` where the tool takes a list of
    commands). ``extra_args`` are arguments the tool requires on every call (OpenHands:
    ``security_risk``); ``wait_args`` raise the tool's own time limit for a command that runs long
    (without them some harnesses kill it after seconds)."""

    name: str
    command_arg: str
    command_is_list: bool = False
    wait_args: dict[str, object] = field(default_factory=dict)
    extra_args: dict[str, object] = field(default_factory=dict)

    def arguments(self, command: str, *, wait: bool = False) -> dict[str, object]:
        return {
            self.command_arg: [command] if self.command_is_list else command,
            **self.extra_args,
            **(self.wait_args if wait else {}),
        }


@dataclass(frozen=True)
class TextEdit:
    """A harness whose model edits files by writing them into its reply, not through a tool (aider):
    ``marker`` is text its prompt always carries, ``render(patch, message)`` writes a git patch in the
    harness's own edit format after ``message``, so a scripted policy can make the edit."""

    marker: str
    render: Callable[[str, str], str]


class HarnessAdapter(ABC):
    """Everything Polar knows about one harness; nothing outside this class names the harness."""

    name: ClassVar[str]
    source: ClassVar[InstallSource]  # npm package or Python venv, pinned
    # The API its configuration speaks to the proxy: a key of ``proxy.app.API_MODULES`` (chat,
    # responses, messages, gemini), shown by ``polar doctor``; tests pick the decoder by it.
    wire_api: ClassVar[str]
    shell_tool: ClassVar[ShellTool | None] = None  # for scripted policies (None: it has none)
    text_edit: ClassVar[TextEdit | None] = None  # its edit format, when edits are reply text
    # The command that ends a run for harnesses that stop only when the model runs it (its prompt
    # carries it verbatim); a scripted final answer runs it through the shell tool.
    finish_command: ClassVar[str | None] = None
    noise_dirs: ClassVar[tuple[str, ...]] = ()  # state it may drop in the task tree, never part of a patch
    volatile_rules: ClassVar[tuple[VolatileRule, ...]] = ()  # per-day / per-machine prompt lines
    # Extra deadline `polar demo` grants: the embedded CPU model prefills a long first prompt for minutes.
    prefill_allowance_s: ClassVar[float] = 0.0

    @property
    def version(self) -> str:
        return self.source.version

    @property
    def package(self) -> str:
        return self.source.spec

    # --- install ---
    def install_dir(self, root: Path | None = None) -> Path:
        return (root or cache_root()) / "harnesses" / f"{self.name}-{self.version}"

    def is_installed(self, root: Path | None = None) -> bool:
        return sources.is_installed(self.source, self.install_dir(root))

    def install_commands(self, root: Path | None = None) -> list[list[str]]:
        return self.source.install_commands(self.install_dir(root))

    def install(self, root: Path | None = None, *, timeout_s: float = 1800) -> Path:
        return sources.install(self.source, self.install_dir(root), timeout_s=timeout_s)

    @property
    def launcher(self) -> list[str]:
        """The argv prefix that starts the CLI inside the sandbox."""
        return self.source.launcher

    def version_command(self) -> list[str]:
        return [*self.launcher, "--version"]

    # --- per-episode ---
    @abstractmethod
    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        """Files to write before the run: absolute path inside the sandbox -> content."""

    @abstractmethod
    def env(self, ctx: HarnessContext) -> dict[str, str]:
        """Environment on top of the sandbox's fixed one."""

    @abstractmethod
    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        """The headless command line; the prompt is one argv element, stdin is empty."""

    @abstractmethod
    def summarize(self, stdout: str) -> HarnessSummary:
        """Read the harness's JSON event stream (possibly only its tail)."""

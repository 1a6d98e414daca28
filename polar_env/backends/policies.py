"""Named scripted policies (for the demo, CI and tests), resolved on whichever node runs the proxy.

A policy picks the text of each model call; ScriptedBackend has the real model score it, so ids
and logprobs stay real. ``gold`` replays a task's gold patch through the harness's own shell tool
(one tool call, then a final answer): it proves the whole path — harness, sandbox, proxy, grading
— can earn reward 1.0, and is labelled as such wherever its turns are reported.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from polar_env.harness_adapters.base import ShellTool
from polar_env.harness_adapters.registry import shell_tools
from polar_env.tasks.models import Task

Policy = Callable[[str | None, int, str], str]

DONE = "I applied the fix and verified it. Done."


def offered_shell_tool(prompt_text: str) -> ShellTool | None:
    """The shell tool (declared by each adapter) that the prompt's tool list offers, if any."""
    return next((tool for tool in shell_tools() if f'"name": "{tool.name}"' in prompt_text), None)


def tool_call(tool: ShellTool, command: str, *, wait: bool = False) -> str:
    """A Hermes tool call running ``command`` with ``tool``."""
    return "<tool_call>\n" + json.dumps({"name": tool.name, "arguments": tool.arguments(command, wait=wait)}) \
        + "\n</tool_call>"


def shell_call(prompt_text: str, command: str) -> str:
    """A tool call running ``command`` with whichever shell tool the harness offers (else a final answer)."""
    tool = offered_shell_tool(prompt_text)
    return DONE if tool is None else tool_call(tool, command)


def _task_of(session_id: str | None, prompt_text: str, tasks: list[Task]) -> Task | None:
    """By episode id (``<instance_id>.s<k>.a<n>``) where the backend sees it, else by the issue
    text in the prompt (a policy server behind the proxy sees only token ids)."""
    matches = [t for t in tasks if session_id and session_id.startswith(t.instance_id + ".")]
    if matches:
        return max(matches, key=lambda t: len(t.instance_id))
    return next((t for t in tasks if _needle(t.problem_statement) in prompt_text), None)


def _needle(problem: str) -> str:
    return problem.strip().splitlines()[0][:60]


def gold_policy(tasks: list[Task]) -> Policy:
    def policy(session_id: str | None, call_number: int, prompt_text: str) -> str:
        task = _task_of(session_id, prompt_text, tasks)
        if task is None or "<tool_response>" in prompt_text:
            return DONE
        return shell_call(prompt_text, f"cd /testbed && git apply <<'POLAR_PATCH_EOF'\n{task.patch}POLAR_PATCH_EOF")

    return policy


def noop_policy(tasks: list[Task]) -> Policy:
    """One harmless tool call, then a final answer: the shortest multi-turn episode."""
    def policy(session_id: str | None, call_number: int, prompt_text: str) -> str:
        return DONE if "<tool_response>" in prompt_text else shell_call(prompt_text, "ls /testbed")

    return policy


def answer_policy(tasks: list[Task]) -> Policy:
    """A final answer at once, touching nothing: a zero-reward rollout."""
    return lambda session_id, call_number, prompt_text: DONE


POLICIES: dict[str, Callable[[list[Task]], Policy]] = {"gold": gold_policy, "noop": noop_policy,
                                                        "answer": answer_policy}

LABELS = {
    "gold": "scripted gold-patch replay (not a model's choice; the model only scores it)",
    "noop": "scripted no-op tool call (not a model's choice; the model only scores it)",
    "answer": "scripted final answer without any edit (not a model's choice; the model only scores it)",
}


def make_policy(name: str, tasks: list[Task]) -> Policy:
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    return POLICIES[name](tasks)

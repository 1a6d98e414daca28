"""Named scripted policies (for the demo, CI and tests), resolved on whichever node runs the proxy.

A policy picks the text of each model call; ScriptedBackend has the real model score it, so ids
and logprobs stay real. ``gold`` replays a task's gold patch (a Harbor task's ``solution/solve.sh``) through
the harness's own shell tool, or its text edit format where edits are reply text (one edit, then a final
answer): it proves the whole path — harness, sandbox, proxy, grading — can earn reward 1.0, and is labelled as
such wherever its turns are reported.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable

from polar_env.harness_adapters.base import ShellTool
from polar_env.harness_adapters.registry import finish_commands, shell_tools, text_edits
from polar_env.tasks.models import Task, patch_files

Policy = Callable[[str | None, int, str], str]

DONE = "I applied the fix and verified it. Done."


def offered_shell_tool(prompt_text: str) -> ShellTool | None:
    """The shell tool (declared by each adapter) that the prompt's tool list offers, if any; where two
    harnesses name theirs alike (``terminal``), the one whose required extra arguments the prompt
    declares too."""
    offered = [
        tool
        for tool in shell_tools()
        if f'"name": "{tool.name}"' in prompt_text
        and all(f'"{arg}"' in prompt_text for arg in tool.extra_args)
    ]
    return max(offered, key=lambda tool: len(tool.extra_args), default=None)


def tool_call(tool: ShellTool, command: str, *, wait: bool = False) -> str:
    """A Hermes tool call running ``command`` with ``tool``."""
    return (
        "<tool_call>\n"
        + json.dumps({"name": tool.name, "arguments": tool.arguments(command, wait=wait)})
        + "\n</tool_call>"
    )


def shell_call(prompt_text: str, command: str) -> str:
    """A tool call running ``command`` with whichever shell tool the harness offers (else a final answer)."""
    tool = offered_shell_tool(prompt_text)
    return DONE if tool is None else tool_call(tool, command)


def final_answer(prompt_text: str, text: str = DONE) -> str:
    """``text`` as the final answer; a harness that ends only when the model runs its finish command
    (the command is in its prompt) gets that command, with ``text`` as the output after it."""
    tool = offered_shell_tool(prompt_text)
    finish = next((c for c in finish_commands() if c in prompt_text), None)
    return (
        text if tool is None or finish is None else tool_call(tool, f"{finish} && echo {shlex.quote(text)}")
    )


def patch_edit(prompt_text: str, patch: str, text: str = DONE, workdir: str = "/testbed") -> str:
    """Apply a git patch with the harness's own means: ``git apply`` in ``workdir`` (the task's tree)
    through its shell tool, else its text edit format (after ``text``); a harness with neither gets
    ``text`` as a final answer."""
    if offered_shell_tool(prompt_text) is not None:
        return shell_call(
            prompt_text,
            f"cd {shlex.quote(workdir)} && git apply <<'POLAR_PATCH_EOF'\n{patch}POLAR_PATCH_EOF",
        )
    edit = next((e for e in text_edits() if e.marker in prompt_text), None)
    return text if edit is None else edit.render(patch, text)


def _task_of(session_id: str | None, prompt_text: str, tasks: list[Task]) -> Task | None:
    """By episode id (``<instance_id>.s<k>.a<n>``) where the backend sees it, else by the issue
    text in the prompt (a policy server behind the proxy sees only token ids)."""
    matches = [t for t in tasks if session_id and session_id.startswith(t.instance_id + ".")]
    if matches:
        return max(matches, key=lambda t: len(t.instance_id))
    return next(
        (t for t in tasks if t.problem_statement.strip() and _needle(t.problem_statement) in prompt_text),
        None,
    )


def _needle(problem: str) -> str:
    return problem.strip().splitlines()[0][:60]


def gold_policy(tasks: list[Task]) -> Policy:
    def policy(session_id: str | None, call_number: int, prompt_text: str) -> str:
        task = _task_of(session_id, prompt_text, tasks)
        if task is None or "<tool_response>" in prompt_text:
            return final_answer(prompt_text)
        if task.harbor is not None:  # a Harbor task's gold is its solution/solve.sh, run by the harness
            from polar_env.tasks.harbor import gold_command

            return shell_call(prompt_text, gold_command(task))
        return patch_edit(prompt_text, task.patch, workdir=task.workdir)

    return policy


def gold_steps_policy(tasks: list[Task]) -> Policy:
    """The gold patch reached the way an agent reaches it, in five calls: list the repository, read
    the code around the patch's first hunk, apply the patch, check the change (a diff stat and a
    compile of the changed Python files), then a final answer. Each answer opens with a sentence of
    reasoning, as a model's do, so answers are 50-300 tokens and the harness runs four tools: a
    realistic run stage for measuring pipelines (bench/pipeline.py). A task without a git patch
    (Harbor) or a harness without a shell tool gets the gold policy's answers."""
    gold = gold_policy(tasks)

    def policy(session_id: str | None, call_number: int, prompt_text: str) -> str:
        task = _task_of(session_id, prompt_text, tasks)
        if (
            task is None
            or task.harbor is not None
            or not task.patch
            or offered_shell_tool(prompt_text) is None
        ):
            return gold(session_id, call_number, prompt_text)
        files, tree = patch_files(task.patch), shlex.quote(task.workdir)
        steps = [
            (
                (
                    "Let me look at the repository first to see how it is laid out and whether the tree is "
                    "clean."
                ),
                f"cd {tree} && git status --short && ls",
            ),
            (
                (
                    f"The issue points at {files[0]}. I will read the code around the place that needs to "
                    "change."
                ),
                f"cd {tree} && sed -n '{_hunk_lines(task.patch)}p' {shlex.quote(files[0])}",
            ),
            (f"I see the problem now. Here is the fix for {files[0]}, as a patch applied with git.", None),
            (
                "Now I will check that the change is in place and that the changed modules still compile.",
                f"cd {tree} && git diff --stat" + _compile_check(files),
            ),
        ]
        if call_number >= len(steps):
            return final_answer(
                prompt_text,
                f"The fix is in {', '.join(files)}: the change is applied, the diff "
                "touches only those files and the modules compile. Done.",
            )
        thought, command = steps[call_number]
        call = (
            patch_edit(prompt_text, task.patch, workdir=task.workdir)
            if command is None
            else shell_call(prompt_text, command)
        )
        return f"{thought}\n{call}"

    return policy


def _compile_check(files: list[str]) -> str:
    python = [shlex.quote(f) for f in files if f.endswith(".py")]
    return f" && python3 -m py_compile {' '.join(python)}" if python else ""


def _hunk_lines(patch: str) -> str:
    """``A,B`` for sed: the old-side lines of the patch's first hunk, with a few lines around them."""
    match = re.search(r"^@@ -(\d+)(?:,(\d+))? ", patch, re.M)
    start, length = (int(match.group(1)), int(match.group(2) or 1)) if match else (1, 40)
    return f"{max(1, start - 5)},{start + length + 5}"


def noop_policy(tasks: list[Task]) -> Policy:
    """One harmless tool call, then a final answer: the shortest multi-turn episode."""

    def policy(session_id: str | None, call_number: int, prompt_text: str) -> str:
        return (
            final_answer(prompt_text) if "<tool_response>" in prompt_text else shell_call(prompt_text, "ls")
        )

    return policy


def answer_policy(tasks: list[Task]) -> Policy:
    """A final answer at once, touching nothing: a zero-reward rollout."""
    return lambda session_id, call_number, prompt_text: final_answer(prompt_text)


POLICIES: dict[str, Callable[[list[Task]], Policy]] = {
    "gold": gold_policy,
    "gold-steps": gold_steps_policy,
    "noop": noop_policy,
    "answer": answer_policy,
}

LABELS = {
    "gold": "scripted gold-patch replay (not a model's choice; the model only scores it)",
    "gold-steps": "scripted gold-patch replay in five steps (not a model's choice; the model only scores it)",
    "noop": "scripted no-op tool call (not a model's choice; the model only scores it)",
    "answer": "scripted final answer without any edit (not a model's choice; the model only scores it)",
}


def make_policy(name: str, tasks: list[Task]) -> Policy:
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    return POLICIES[name](tasks)

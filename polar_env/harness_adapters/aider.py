"""aider (``aider-chat``, PyPI): streamed chat completions through LiteLLM; edits are text, not tool calls.

aider has no shell tool the model can call unattended (``--yes-always`` never confirms a shell
command), so its one edit tool is its edit format: the model answers with a unified diff in a
```` ```diff ```` fence (``--edit-format udiff``) and aider applies it to the files it names, adding them
to the chat (``--yes-always``). With ``--message`` it sends that one request, applies the reply and
exits. Everything is in one config file passed with ``--config`` (so no ``.aider.conf.yml`` in the
task tree is read); the key is ``OPENAI_API_KEY`` in the environment. The model metadata file gives
LiteLLM the served model's window, so aider never fetches LiteLLM's price list; ``--no-check-update``
and ``--analytics-disable`` turn off its other calls out. History files live in HOME, and
``--no-auto-commits --no-dirty-commits --no-gitignore`` leave the task's git repository alone; its
repo-map cache is the one thing it writes into the tree.

Its repo map (ranked definitions of the tree's files, ~9k tokens of the first prompt) is off
(``map-tokens: 0``): it came out different in rollouts of one task, split its GRPO groups, and
neither ``PYTHONHASHSEED=0`` (it ranks from sets keyed by names, so the per-process ``hash()`` salt
reorders ties) nor ``map-refresh: files`` (in ``auto`` it rebuilds or reuses the map depending on how
long the first build took) made 3 sandboxed rollouts of a bundled task agree
(tests/rollout/test_groups_determinism.py). The hash seed stays fixed for whatever else it iterates in set
order (file mentions).
"""

from __future__ import annotations

import json
import re

from polar_env.harness_adapters.base import HarnessAdapter, HarnessContext, HarnessSummary, TextEdit
from polar_env.harness_adapters.sources import PythonVenv

KEY_ENV = "OPENAI_API_KEY"
EDIT_FORMAT = "udiff"
TOKENS = re.compile(r"^Tokens: .* sent, .* received\.", re.MULTILINE)
APPLIED = re.compile(r"^Applied edit to (.+)$", re.MULTILINE)
ERROR = re.compile(r"^litellm\.\w+: ?(.*)$", re.MULTILINE)
FILE_HEADER = re.compile(r"^--- ", re.MULTILINE)
BANNER_END = re.compile(r"^Repo-map: .*$", re.MULTILINE)  # the last line aider prints before the first reply


def udiff_reply(patch: str, message: str) -> str:
    """A git patch as aider's udiff edit format: one ```` ```diff ```` fence per file, each opening
    with its ``--- a/``/``+++ b/`` lines (aider reads no ``diff --git``/``index`` headers)."""
    fences = []
    for part in re.split(r"^diff --git .*\n", patch, flags=re.MULTILINE):
        start = FILE_HEADER.search(part)
        if start is not None:
            fences.append("```diff\n" + part[start.start() :].rstrip("\n") + "\n```")
    return message + "\n\n" + "\n\n".join(fences) + "\n"


class AiderAdapter(HarnessAdapter):
    name = "aider"
    source = PythonVenv("aider-chat", "0.86.2", "aider", lock="aider.txt")
    wire_api = "chat"
    # the sentence its udiff system prompt always carries
    text_edit = TextEdit("Return edits similar to unified diffs that `diff -U0` would produce.", udiff_reply)
    noise_dirs = (".aider.tags.cache.v4",)  # its repo-map cache, written in the repository root
    # ~1.5k first-prompt tokens without its repo map (~11-13k with it); later turns carry the files it edits
    prefill_allowance_s = 480.0

    def config_path(self, ctx: HarnessContext) -> str:
        return f"{ctx.home}/.aider-polar.conf.yml"

    def metadata_path(self, ctx: HarnessContext) -> str:
        return f"{ctx.home}/.aider-polar.model.json"

    def model(self, ctx: HarnessContext) -> str:
        return f"openai/{ctx.model_name}"

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        settings = {
            "model": self.model(ctx),
            "openai-api-base": ctx.base_url,
            "edit-format": EDIT_FORMAT,
            "model-metadata-file": self.metadata_path(ctx),
            "show-model-warnings": False,
            "yes-always": True,
            "auto-commits": False,
            "dirty-commits": False,
            "gitignore": False,
            "pretty": False,
            "fancy-input": False,
            "suggest-shell-commands": False,
            "detect-urls": False,
            "auto-lint": False,
            "check-update": False,
            "analytics-disable": True,
            "show-release-notes": False,
            "disable-playwright": True,
            "map-tokens": 0,  # no repo map: see the module docstring
            "chat-history-file": f"{ctx.home}/.aider.chat.history.md",
            "input-history-file": f"{ctx.home}/.aider.input.history",
        }
        metadata = {
            self.model(ctx): {
                "max_input_tokens": 131072,
                "max_output_tokens": 8192,
                "mode": "chat",
                "litellm_provider": "openai",
                "input_cost_per_token": 0.0,
                "output_cost_per_token": 0.0,
            }
        }
        # JSON is valid YAML; aider reads the config with configargparse's YAML parser
        return {
            self.config_path(ctx): json.dumps(settings, indent=2) + "\n",
            self.metadata_path(ctx): json.dumps(metadata, indent=2) + "\n",
        }

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {KEY_ENV: ctx.session_key, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONHASHSEED": "0"}

    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        return [*self.launcher, "--config", self.config_path(ctx), "--message", prompt]

    def summarize(self, stdout: str) -> HarnessSummary:
        """Read its plain console: each reply is followed by a ``Tokens: ... sent, ... received.`` line,
        then ``Applied edit to <file>`` per edited file; an API failure is a ``litellm.<Error>:`` line."""
        replies = list(TOKENS.finditer(stdout))
        edits = APPLIED.findall(stdout)
        errors = ERROR.findall(stdout)
        s = HarnessSummary(
            turns=len(replies),
            tool_calls=len(edits),
            tool_names=[EDIT_FORMAT] * len(edits),
            events=len(replies) + len(edits) + len(errors),
        )
        if replies:
            before = stdout[: replies[-1].start()]
            previous = max(
                (
                    m.end()
                    for m in [
                        *TOKENS.finditer(before),
                        *APPLIED.finditer(before),
                        *BANNER_END.finditer(before),
                    ]
                ),
                default=0,
            )
            s.final_message = before[previous:].strip() or None
        s.error = errors[-1] if errors else None
        s.finished = bool(replies) and s.error is None
        return s

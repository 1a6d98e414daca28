"""mini-SWE-agent (``mini``, PyPI): chat completions through LiteLLM, one ``bash`` tool, its SWE-bench config.

It runs its own ``swebench.yaml`` (the prompt, step limit and 60 s command timeout its SWE-bench
results use, written for a task in /testbed) plus a second config file that points the model at
the proxy and runs commands locally, i.e. inside the sandbox, instead of in the docker container
that config names: ``openai/<model>`` sends LiteLLM through the OpenAI client, whose base URL is
``api_base`` and whose key is ``OPENAI_API_KEY``. It ends only when the model runs
``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (the lines after it are its submission), so that
command is its ``finish_command``. ``-y`` runs commands unconfirmed and ``--exit-immediately``
skips the "new task?" question; ``MSWEA_CONFIGURED`` skips the first-run setup wizard.
"""

from __future__ import annotations

import json
import re

from polar_env.harness_adapters.base import HarnessAdapter, HarnessContext, HarnessSummary, ShellTool
from polar_env.harness_adapters.sources import HARNESS_MOUNT, PythonVenv

KEY_ENV = "OPENAI_API_KEY"  # LiteLLM's OpenAI provider reads it
STEP = re.compile(r"^mini-swe-agent \(step (\d+), ", re.MULTILINE)
# each message is printed as a "<Role>:" line, then its content (InteractiveAgent.add_messages)
ROLE = re.compile(r"^(Tool|User|Exit):$", re.MULTILINE)
NOT_SUBMITTED = {"LimitsExceeded", "TimeExceeded", "RepeatedFormatError"}


class MiniSweAgentAdapter(HarnessAdapter):
    name = "mini-swe-agent"
    source = PythonVenv("mini-swe-agent", "2.4.6", "mini", lock="mini-swe-agent.txt")
    wire_api = "chat"
    shell_tool = ShellTool("bash", "command")  # a command may run 60 s (environment.timeout)
    finish_command = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    # two calls of ~1.7k prompt tokens after seconds of LiteLLM import: at load 11 on the 2-core
    # machine one of two quick-demo episodes ended 12 s past the plain 120 s deadline
    prefill_allowance_s = 120.0

    def config_path(self, ctx: HarnessContext) -> str:
        return f"{ctx.home}/.config/polar-mini.yaml"

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        config = {
            "model": {
                "model_name": f"openai/{ctx.model_name}",
                "cost_tracking": "ignore_errors",
                "model_kwargs": {"api_base": ctx.base_url},
            },
            # the sandbox is the environment; its BASH_ENV (/root/.bashrc, a conda image's) is not ours
            "environment": {"environment_class": "local", "cwd": ctx.workdir, "env": {"BASH_ENV": ""}},
        }
        return {self.config_path(ctx): json.dumps(config, indent=2) + "\n"}  # JSON is valid YAML

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {
            KEY_ENV: ctx.session_key,
            "MSWEA_CONFIGURED": "true",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_GLOBAL_CONFIG_DIR": f"{ctx.home}/.config/mini-swe-agent",
            # LiteLLM fetches its model price list at import unless told to use the bundled copy
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            # it retries every failed call 10 times over minutes; a proxy 4xx (episode stopped,
            # budget spent) is final, so two retries cover a backend's passing 5xx
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "3",
        }

    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        return [
            *self.launcher,
            "-y",
            "--exit-immediately",
            "-c",
            "swebench.yaml",
            "-c",
            self.config_path(ctx),
            "-t",
            prompt,
        ]

    def version_command(self) -> list[str]:
        """``mini`` has no ``--version``; the package says it."""
        return [f"{HARNESS_MOUNT}/bin/python", "-c", "import minisweagent; print(minisweagent.__version__)"]

    def summarize(self, stdout: str) -> HarnessSummary:
        """Read its console log: ``mini-swe-agent (step N, $c):`` per model turn, ``Tool:`` per command
        result, and a final ``Exit:`` whose content is the submission or why it stopped."""
        steps = [int(n) for n in STEP.findall(stdout)]
        roles = ROLE.findall(stdout)
        s = HarnessSummary(
            turns=max(steps, default=0), tool_calls=roles.count("Tool"), events=len(steps) + len(roles)
        )
        s.tool_names = ["bash"] * s.tool_calls
        exits = list(ROLE.finditer(stdout))
        if exits and exits[-1].group(1) == "Exit":
            content = stdout[exits[-1].end() :].split("\nSaved trajectory to ")[0].strip()
            s.finished = content not in NOT_SUBMITTED
            s.final_message = content or None
            if not s.finished:
                s.error = content
        return s

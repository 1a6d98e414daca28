"""The PyPI harnesses (mini-SWE-agent, aider, Hermes Agent, OpenHands): what each is configured with
(docs/harnesses.md), how their console logs are read, and how the scripted policies speak their edit and
finish protocols."""

from __future__ import annotations

import json

from polar_env.harness_adapters import HarnessContext, get_adapter
from polar_env.harness_adapters.aider import udiff_reply
from polar_env.harness_adapters.policies import DONE, final_answer, patch_edit, shell_call
from polar_env.harness_adapters.sources import RPATH

CTX = HarnessContext(session_id="sess-1", session_key="sk-polar-secret", model_name="policy", port=18080)

# the tail of a real `mini` run in bubblewrap (InteractiveAgent's console; litellm's notice included)
MINI_LOG = """
\x1b[1;31mProvider List: https://docs.litellm.ai/docs/providers\x1b[0m


mini-swe-agent (step 1, $0.00):
```
sed -i s/original/edited-by-agent/ hello.py
```

Tool:
<returncode>
0
<output>

────────────────────────────────────────────────────────────────────────────────

mini-swe-agent (step 2, $0.00):
```
echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && echo Done
```

Tool:
<returncode>
-1
<output>

<exception_info>
action was not executed

Exit:
Done

Saved trajectory to '/home/agent/.config/mini-swe-agent/last_mini_run.traj.json'
"""

# a real `aider --message` run: banner, the streamed reply, the token line, the applied edit
AIDER_LOG = """Analytics have been permanently disabled.
Detected dumb terminal, disabling fancy input and pretty output.

Aider v0.86.2
Model: openai/policy with udiff edit format
Git repo: .git with 1 files
Repo-map: using 4096 tokens, auto refresh

Done.

```diff
--- a/hello.py
+++ b/hello.py
@@ -1 +1 @@
-print('original')
+print('edited-by-agent')
```
Tokens: 1.2k sent, 35 received.

hello.py
Applied edit to hello.py
"""

AIDER_AUTH_ERROR = """Aider v0.86.2
Model: openai/policy with udiff edit format
Git repo: none
Repo-map: disabled

litellm.AuthenticationError: AuthenticationError: OpenAIException - unknown
session or wrong API key for this session
The API provider is not able to authenticate you. Check your API key.
"""

# a real `hermes chat --yolo -q` run in bubblewrap: one terminal call, the streamed answer box, the exit
# summary
HERMES_LOG = """Query: Change original to edited in hello.py.
Initializing agent...\r
────────────────────────────────────────\r

  ┊ 💻 preparing terminal…
  ┊ 💻 $         sed -i s/original/edited-by-agent/ hello.py  0.1s

╭─ ⚕ Hermes ───────────────────────────────────────────────────────────────────╮
    Done: hello.py now says edited-by-agent.
╰──────────────────────────────────────────────────────────────────────────────╯

Resume this session with:
  hermes --resume 20261130_184440_00b5ac

Session:        20261130_184440_00b5ac
Duration:       24s
Messages:       4 (1 user, 2 tool calls)
"""

# a real run whose first call got a 400: it gives up at once, prints the message in a panel and exits 0
HERMES_400 = """Query: Create out.txt\n\
Initializing agent...\r\n────────────────────────────────────────\r\n\n\
⚠️  API call failed (attempt 1/3): BadRequestError [HTTP 400]\r\n   🔌 Provider: custom  Model: policy\r\n\
   📝 Error: HTTP 400: polar-test-refusal\r\n\
❌ Non-retryable error (HTTP 400): HTTP 400: polar-test-refusal\r\n\
❌ Non-retryable client error (HTTP 400). Aborting.\r\n\
 ─  ⚕ Hermes  ───────────────────────────────────────────────────────────────── \r\n\
                                                                                \r\n\
     HTTP 400: polar-test-refusal                                               \r\n\
                                                                                \r\n\
 ────────────────────────────────────────────────────────────────────────────── \r\n\n\
Resume this session with:\n  hermes --resume 20261130_185958_f579aa\n\n\
Session:        20261130_185958_f579aa\n\
Duration:       7s\nMessages:       1 (1 user, 0 tool calls)\n"""

# a real `openhands --headless --json` run in bubblewrap (tests/harness_adapters/test_harness_e2e.py's edit):
# console lines around one JSON event per line
OPENHANDS_LOG = (
    "OpenHands CLI terminal UI may not work correctly in this environment: Rich detected a non-interactive "
    "or unsupported terminal; interactive UI may not render correctly\n"
    "To override Rich's detection, you can set TTY_INTERACTIVE=1 (and optionally TTY_COMPATIBLE=1).\n"
    "Initializing agent...\n✓ Agent initialized with model: openai/policy\n"
    '{"id": "f375585a-dc8d-4801-a4b2-23c8c5ef442f", "timestamp": "2026-11-30T19:01:16.395692", "source": '
    '"user", "llm_message": {"role": "user", "content": [{"cache_prompt": false, "type": "text", "text": '
    '"Change original to edited in hello.py."}], "tool_calls": null, "tool_call_id": null, "name": null, '
    '"reasoning_content": null, "thinking_blocks": [], "responses_reasoning_item": null}, '
    '"llm_response_id": null, "activated_skills": [], "extended_content": [], "sender": null, '
    '"critic_result": null, "kind": "MessageEvent"}\nAgent is working\n'
    '{"id": "eb0b89d7-9da3-48aa-a625-25af1b6c1280", "timestamp": "2026-11-30T19:01:34.949366", "source": '
    '"agent", "thought": [], "reasoning_content": null, "thinking_blocks": [], "responses_reasoning_item": '
    'null, "action": {"command": "cd /testbed && sed -i s/original/edited-by-agent/ hello.py", "is_input": '
    'false, "timeout": null, "reset": false, "kind": "TerminalAction"}, "tool_name": "terminal", '
    '"tool_call_id": "call_ad8a187b35e2_0", "tool_call": {"id": "call_ad8a187b35e2_0", '
    '"responses_item_id": null, "name": "terminal", "arguments": "{\\"command\\": \\"cd /testbed && sed -i '
    's/original/edited-by-agent/ hello.py\\", \\"security_risk\\": \\"LOW\\"}", "origin": "completion"}, '
    '"llm_response_id": "chatcmpl-ad8a187b35e2435697973481", "security_risk": "LOW", "critic_result": '
    'null, "summary": "terminal: {\\"command\\": \\"cd /testbed && sed -i s/original/edited-by-agent/ '
    'hello.py\\"}", "kind": "ActionEvent"}\n'
    '{"id": "4ffe90af-c7e7-43ff-b8d4-121c8f135fec", "timestamp": "2026-11-30T19:01:36.009503", "source": '
    '"environment", "tool_name": "terminal", "tool_call_id": "call_ad8a187b35e2_0", "observation": '
    '{"content": [{"cache_prompt": false, "type": "text", "text": ""}], "is_error": false, "command": "cd '
    '/testbed && sed -i s/original/edited-by-agent/ hello.py", "exit_code": 0, "timeout": false, '
    '"metadata": {"exit_code": 0, "pid": -1, "username": "agent", "hostname": "sandbox", "working_dir": '
    '"/testbed", "py_interpreter_path": "", "prefix": "", "suffix": "\\n[The command completed with exit '
    'code 0.]"}, "full_output_save_dir": null, "kind": "TerminalObservation"}, "action_id": '
    '"eb0b89d7-9da3-48aa-a625-25af1b6c1280", "kind": "ObservationEvent"}\n'
    '{"id": "006446aa-8e80-4baa-9bab-eea98d030378", "timestamp": "2026-11-30T19:01:47.501326", "source": '
    '"agent", "llm_message": {"role": "assistant", "content": [{"cache_prompt": false, "type": "text", '
    '"text": "Done: hello.py now says edited-by-agent."}], "tool_calls": null, "tool_call_id": null, '
    '"name": null, "reasoning_content": null, "thinking_blocks": [], "responses_reasoning_item": null}, '
    '"llm_response_id": "chatcmpl-5ee3b4e2e0ee404cbbab0078", "activated_skills": [], "extended_content": '
    '[], "sender": null, "critic_result": null, "kind": "MessageEvent"}\nAgent finished\n\n'
    "───────────────────────────── CONVERSATION SUMMARY ─────────────────────────────\n"
    "Number of agent messages: 3\nLast message sent by the agent:\n"
    "╭─ Agent ──────────────────────────────────╮\n│ Done: hello.py now says edited-by-agent. │\n"
    "╰──────────────────────────────────────────╯\n"
    "────────────────────────────────────────────────────────────────────────────────\nGoodbye! 👋\n"
    "Conversation ID: d7784d7864a241448e03c6c8645c21db\n"
    "Hint: run openhands --resume d7784d78-64a2-4144-8e03-c6c8645c21db to resume this\nconversation.\n"
)


GOLD = """diff --git a/a.py b/a.py
index 1111111..2222222 100644
--- a/a.py
+++ b/a.py
@@ -1 +1 @@
-x = 1
+x = 2
diff --git a/b.py b/b.py
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/b.py
@@ -0,0 +1 @@
+y = 3
"""


def test_mini_swe_agent_runs_its_swebench_config_pointed_at_the_proxy():
    mini = get_adapter("mini-swe-agent")
    assert mini.source.kind == "python-venv" and mini.package == "mini-swe-agent==2.4.6"
    files = mini.config_files(CTX)
    cfg = json.loads(files["/home/agent/.config/polar-mini.yaml"])
    assert cfg["model"] == {
        "model_name": "openai/policy",
        "cost_tracking": "ignore_errors",
        "model_kwargs": {"api_base": "http://127.0.0.1:18080/s/sess-1/v1"},
    }
    # commands run where mini runs, inside the sandbox (swebench.yaml names a docker container)
    assert cfg["environment"] == {"environment_class": "local", "cwd": "/testbed", "env": {"BASH_ENV": ""}}
    assert "sk-polar-secret" not in files["/home/agent/.config/polar-mini.yaml"]
    env = mini.env(CTX)
    assert env["OPENAI_API_KEY"] == "sk-polar-secret" and env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert env["MSWEA_CONFIGURED"] == "true"  # else its first-run wizard waits for input
    assert mini.command(CTX, "fix it") == [
        "/opt/harness/bin/python",
        "/opt/harness/bin/mini",
        "-y",
        "--exit-immediately",
        "-c",
        "swebench.yaml",
        "-c",
        "/home/agent/.config/polar-mini.yaml",
        "-t",
        "fix it",
    ]


def test_mini_swe_agent_summary_from_its_console():
    s = get_adapter("mini-swe-agent").summarize(MINI_LOG)
    assert (s.turns, s.tool_calls, s.final_message, s.finished, s.error) == (2, 2, "Done", True, None)
    stopped = get_adapter("mini-swe-agent").summarize(
        "mini-swe-agent (step 3, $0.00):\n```\nls\n```\n\nExit:\nRepeatedFormatError\n"
    )
    assert not stopped.finished and stopped.error == "RepeatedFormatError" and stopped.turns == 3


def test_aider_config_is_one_file_and_calls_nothing_else():
    aider = get_adapter("aider")
    assert aider.package == "aider-chat==0.86.2" and aider.shell_tool is None and aider.text_edit is not None
    files = aider.config_files(CTX)
    cfg = json.loads(files["/home/agent/.aider-polar.conf.yml"])
    assert cfg["model"] == "openai/policy" and cfg["openai-api-base"] == "http://127.0.0.1:18080/s/sess-1/v1"
    assert cfg["edit-format"] == "udiff" and cfg["yes-always"] is True
    assert cfg["check-update"] is False and cfg["analytics-disable"] is True and cfg["auto-commits"] is False
    assert cfg["chat-history-file"].startswith("/home/agent/")  # not in the task tree
    meta = json.loads(files[cfg["model-metadata-file"]])
    assert meta["openai/policy"]["max_input_tokens"] > 0  # so it never fetches LiteLLM's price list
    assert all("sk-polar-secret" not in text for text in files.values())
    assert aider.env(CTX)["OPENAI_API_KEY"] == "sk-polar-secret"
    assert aider.command(CTX, "fix it") == [
        "/opt/harness/bin/python",
        "/opt/harness/bin/aider",
        "--config",
        "/home/agent/.aider-polar.conf.yml",
        "--message",
        "fix it",
    ]


def test_aider_summary_from_its_console():
    s = get_adapter("aider").summarize(AIDER_LOG)
    assert (s.turns, s.tool_calls, s.finished, s.error) == (1, 1, True, None)
    assert s.final_message.startswith("Done.\n\n```diff") and s.final_message.endswith("```")
    failed = get_adapter("aider").summarize(AIDER_AUTH_ERROR)  # it exits 0 after an API error
    assert not failed.finished and failed.error.startswith("AuthenticationError")


def test_udiff_reply_is_one_fence_per_file_without_git_headers():
    reply = udiff_reply(GOLD, "Fixed.")
    assert reply.startswith("Fixed.\n\n```diff\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n```")
    assert "```diff\n--- /dev/null\n+++ b/b.py\n@@ -0,0 +1 @@\n+y = 3\n```" in reply
    assert "diff --git" not in reply and "index " not in reply


def test_policies_speak_each_protocol():
    mini_prompt = '"name": "bash" ... finish with `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`.'
    answer = final_answer(mini_prompt, "All set.")
    call = json.loads(answer.split("<tool_call>\n")[1].split("\n</tool_call>")[0])
    assert call == {
        "name": "bash",
        "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && echo 'All set.'"},
    }
    assert final_answer('"name": "bash" and no finish command') == DONE  # Pi's bash tool: plain text ends it
    aider_prompt = "Return edits similar to unified diffs that `diff -U0` would produce."
    assert patch_edit(aider_prompt, GOLD) == udiff_reply(GOLD, DONE)
    assert patch_edit("no tools, no edit format", GOLD) == DONE
    assert "git apply" in patch_edit(mini_prompt, GOLD)


def test_hermes_agent_home_points_its_custom_provider_at_the_proxy():
    hermes = get_adapter("hermes-agent")
    assert hermes.package == "hermes-agent==0.19.0" and hermes.shell_tool.name == "terminal"
    files = hermes.config_files(CTX)
    cfg = json.loads(files["/home/agent/.hermes/config.yaml"])
    assert cfg["model"] == {
        "provider": "custom",
        "base_url": "http://127.0.0.1:18080/s/sess-1/v1",
        "api_key": "${POLAR_SESSION_KEY}",
        "default": "policy",
        "context_length": 131072,
        "supports_vision": False,
    }
    assert cfg["auxiliary"]["title_generation"]["enabled"] is False  # no second, unrelated chain
    assert cfg["security"] == {"tirith_enabled": False, "allow_lazy_installs": False}  # no downloads
    assert all("sk-polar-secret" not in text for text in files.values())
    assert hermes.env(CTX) == {"HERMES_HOME": "/home/agent/.hermes", "POLAR_SESSION_KEY": "sk-polar-secret"}
    assert hermes.command(CTX, "fix it") == [
        "/opt/harness/bin/python",
        "/opt/harness/bin/hermes",
        "chat",
        "--yolo",
        "-q",
        "fix it",
    ]


def test_hermes_agent_summary_from_its_console():
    s = get_adapter("hermes-agent").summarize(HERMES_LOG)
    assert (s.turns, s.tool_calls, s.tool_names, s.finished, s.error) == (2, 1, ["terminal"], True, None)
    assert s.final_message == "Done: hello.py now says edited-by-agent."
    failed = get_adapter("hermes-agent").summarize(HERMES_400)  # it exits 0 after giving up
    assert (
        not failed.finished and failed.error == "Non-retryable error (HTTP 400): HTTP 400: polar-test-refusal"
    )
    assert failed.final_message == "HTTP 400: polar-test-refusal" and failed.turns == 0
    cut = get_adapter("hermes-agent").summarize(HERMES_LOG.split("\nResume")[0])  # killed before its summary
    assert not cut.finished and cut.tool_calls == 1


def test_openhands_runs_headless_on_its_portable_python_pointed_at_the_proxy(tmp_path):
    oh = get_adapter("openhands")
    assert (
        oh.package == "openhands==1.16.0"
        and oh.source.kind == "portable-python"
        and oh.source.python == "3.12"
    )
    assert oh.config_files(CTX) == {}
    env = oh.env(CTX)
    assert (
        env["LLM_BASE_URL"] == "http://127.0.0.1:18080/s/sess-1/v1"
        and env["LLM_API_KEY"] == "sk-polar-secret"
    )
    assert env["LLM_MODEL"] == "openai/policy" and env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert oh.command(CTX, "fix it") == [
        "/opt/harness/bin/python3.12",
        "/opt/harness/bin/openhands",
        "--headless",
        "--json",
        "--override-with-envs",
        "-t",
        "fix it",
    ]
    # a copy of the host interpreter, its library path made relative, so it runs from /opt/harness
    cmds = oh.source.install_commands(tmp_path)
    assert ["patchelf", "--set-rpath", RPATH, str(tmp_path / "bin" / "python3.12")] in cmds
    assert cmds[-1][-1] == "openhands==1.16.0" and cmds[-1][0] == str(tmp_path / "bin" / "python3.12")


def test_openhands_summary_from_its_json_events():
    s = get_adapter("openhands").summarize(OPENHANDS_LOG)
    assert (s.turns, s.tool_calls, s.tool_names, s.finished, s.error) == (2, 1, ["terminal"], True, None)
    assert s.final_message == "Done: hello.py now says edited-by-agent."
    assert s.unparsed_lines > 0 and s.events == 4  # its console lines are not events


def test_the_shell_tool_a_prompt_offers_is_the_one_whose_required_arguments_it_declares():
    """OpenHands' shell tool is ``terminal`` and requires ``security_risk``; a scripted call carries it.
    Hermes Agent's is ``terminal`` too, without it: its calls do not."""
    prompt = '{"name": "terminal", "parameters": {"properties": {"security_risk": {}, "command": {}}}}'
    call = json.loads(shell_call(prompt, "ls").split("<tool_call>\n")[1].split("\n</tool_call>")[0])
    assert call == {"name": "terminal", "arguments": {"command": "ls", "security_risk": "LOW"}}
    hermes = (
        '{"name": "terminal", "parameters": {"properties": {"command": {}, "timeout": {}}}}'  # Hermes Agent's
    )
    call = json.loads(shell_call(hermes, "ls").split("<tool_call>\n")[1].split("\n</tool_call>")[0])
    assert call == {"name": "terminal", "arguments": {"command": "ls"}}

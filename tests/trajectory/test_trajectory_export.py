"""Exports: Polar JSONL round trip, the NeMo-RL /run shape passes the contract check, GRPO rows."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from repo_paths import REPO
from trajectory_helpers import call, long_chain, session, three_turn

from polar_env import fastjson
from polar_env.chat.messages import ToolCall
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.checks import check_group, check_nemo_result, check_path, rescore
from polar_env.trajectory.export import (
    TrajectoryWriter,
    grpo_advantages,
    grpo_rows,
    jsonl_line,
    read_trajectories,
    to_nemo_gym_result,
    write_jsonl,
)
from polar_env.trajectory.models import EpisodeTimings
from polar_env.wire.shape import encode, to_builtins

DOCS = REPO / "docs" / "trajectories.md"
ANY = "<any value>"


def _fragmented():
    c = three_turn()[:2]
    side = call(2, [50, 51], [52, 53], reason="side call")
    compacted = call(3, [1, 2, 60, 61], [62, 63, 64], reason="compaction")
    after = call(4, [1, 2, 60, 61, 62, 63, 64, 65], [66], parent=3)
    return build_trajectory(session(), c + [side, compacted, after], reward=1.0)


def test_nemo_export_of_one_chain_passes_the_contract():
    traj = build_trajectory(session(), three_turn(), reward=1.0)
    result = to_nemo_gym_result(
        traj, reward=1.0, responses_create_params={"input": [], "temperature": 1.0}
    ).row()
    assert check_nemo_result(result) == []
    trainable = [it for it in result["response"]["output"] if it.get("generation_token_ids")]
    assert len(trainable) == 3
    assert [it["type"] for it in trainable] == ["function_call", "function_call", "message"]
    assert trainable[0]["prompt_token_ids"] == [1, 2, 3, 4]
    assert trainable[2]["prompt_token_ids"] + trainable[2]["generation_token_ids"] == traj.chains[0].input_ids
    assert [it["type"] for it in result["response"]["output"]] == [
        "function_call",
        "function_call_output",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert result["instance_config"] == {"mask_sample": False}
    assert (result["num_turns"], result["num_chains"], result["trainable_fraction"]) == (3, 1, 1.0)
    assert result["responses_create_params"]["temperature"] == 1.0
    json.dumps(result, allow_nan=False)  # strict JSON


def test_nemo_export_trains_only_the_main_chain():
    traj = _fragmented()
    result = to_nemo_gym_result(traj, reward=1.0, responses_create_params={}).row()
    assert check_nemo_result(result) == []
    output = result["response"]["output"]
    with_ids = [it for it in output if "generation_token_ids" in it]
    assert len(with_ids) == 2  # calls 0 and 1: the main chain
    assert sum(1 for it in output if it["type"] in ("message", "function_call")) == 5  # every call is listed
    assert result["trainable_tokens"] == 5 and result["sampled_tokens"] == 11
    assert math.isclose(result["trainable_fraction"], 5 / 11)
    assert result["polar"]["breaks"][0]["reason"] == "side call"
    assert result["responses_create_params"]["input"] == [
        {"type": "message", "role": "user", "content": "fix the bug"}
    ]


def test_infra_failure_is_masked_and_empty_episode_is_a_masked_placeholder():
    traj = build_trajectory(
        session(), [call(0, [1, 2, 3], [], error="backend: connection refused")], status="error"
    )
    result = to_nemo_gym_result(traj, reward=0.0, responses_create_params={"input": []})
    assert result.instance_config.mask_sample is True  # never dropped, never trained on
    assert check_nemo_result(result.row()) == []
    eos = to_nemo_gym_result(traj, reward=0.0, responses_create_params={"input": []}, placeholder_token_id=2)
    assert eos.response.output[-1]["generation_token_ids"] == [2]
    ok = to_nemo_gym_result(
        build_trajectory(session(), three_turn()),
        reward=0.0,
        responses_create_params={"input": []},
        mask_sample=True,
    )
    assert ok.instance_config.mask_sample is True


def test_array_export_writes_the_same_bytes_without_a_copy_per_call():
    """``arrays=True`` (what the agent server and ``polar rollout`` serialise) must be the same JSON,
    through both writers, and each call's prompt a read-only view of one buffer, not a copy."""
    unscored = call(
        2, [1, 2, 3, 4, 10, 11, 12, 5, 6, 13, 14, 7], [15, 16], parent=1, logprobs=[math.nan, -0.1]
    )
    for traj in (
        build_trajectory(session(), three_turn(), reward=1.0),
        _fragmented(),
        build_trajectory(session(), three_turn()[:2] + [unscored], reward=0.0),
        build_trajectory(session(), [call(0, [1, 2], [], error="backend down")], status="error"),
    ):
        lists = to_nemo_gym_result(traj, responses_create_params={"input": []}).row()
        arrays = to_nemo_gym_result(traj, responses_create_params={"input": []}, arrays=True).row()
        assert jsonl_line(arrays) == jsonl_line(lists) and fastjson.dumps(arrays) + b"\n" == jsonl_line(lists)
        assert json.loads(jsonl_line(arrays)) == lists
        assert check_nemo_result(arrays) == check_nemo_result(lists) == []
    traj = build_trajectory(session(), long_chain(30), reward=1.0)
    carriers = [
        it for it in to_nemo_gym_result(traj, arrays=True).response.output if "prompt_token_ids" in it
    ]
    assert len(carriers) == 30
    last = carriers[-1]["prompt_token_ids"]
    assert all(np.shares_memory(it["prompt_token_ids"], last) for it in carriers)
    with pytest.raises(ValueError, match="read-only"):
        last[0] = 7  # a shared buffer: one item's edit would change every prompt


def _documented_result() -> dict:
    """The ``/run`` example of docs/trajectories.md (section 4) as JSON: a ``...`` value stands for any
    value."""
    block = DOCS.read_text().split("## 4. NeMo Gym `/run` result")[1].split("```json\n")[1].split("```")[0]
    block = re.sub(r",\s*\.\.\.\s*}", "}", block).replace("[...]", "[]").replace("{...}", "{}")
    return json.loads(re.sub(r'(?<!")\.\.\.(?!")', f'"{ANY}"', block))


def _assert_documented(doc: object, value: object, where: str = "result") -> None:
    """Every key of the example is there, each value of the example's JSON type (null where it shows null)."""
    if isinstance(doc, dict):
        assert isinstance(value, dict), f"{where} is not an object"
        for key, sub in doc.items():
            assert key in value, f"{where} has no {key!r}"
            _assert_documented(sub, value[key], f"{where}.{key}")
    elif doc != ANY:
        assert type(value) is type(doc), f"{where} is {value!r}, documented as {doc!r}"


def test_result_row_is_the_json_of_its_shape_with_every_documented_key():
    """The writers serialise ``row()`` (its token ids maybe numpy views): the bytes msgspec writes for the
    shape, which holds every key the docs promise NeMo-RL, and the optional ones only when they are set."""
    params = {"input": [], "temperature": 1.0}
    plain = build_trajectory(session(), three_turn(), status="completed", reward=1.0)
    versioned = build_trajectory(
        session("s2"),
        [
            c.model_copy(update={"session_id": "s2", "policy_version": v})
            for c, v in zip(three_turn(), (0, 0, 1), strict=True)
        ],
        reward=1.0,
    )
    rows = []
    for traj, extra in ((plain, {}), (versioned, {"reward_components": {"tests": 1.0}})):
        lists = to_nemo_gym_result(traj, responses_create_params=params, **extra)
        arrays = to_nemo_gym_result(traj, responses_create_params=params, arrays=True, **extra)
        written = fastjson.dumps(to_builtins(lists))
        assert fastjson.dumps(lists.row()) == encode(lists) == written
        assert jsonl_line(arrays.row()) == written + b"\n" and fastjson.dumps(arrays.row()) == written
        rows.append(json.loads(written))
        _assert_documented(_documented_result(), rows[-1])
        assert check_nemo_result(rows[-1]) == check_nemo_result(arrays.row()) == []
    assert not {"policy_version_min", "policy_version_spread", "reward_components"} & set(rows[0])
    assert (
        rows[1]["policy_version_min"],
        rows[1]["policy_version_spread"],
        rows[1]["reward_components"],
    ) == (0, 1, {"tests": 1.0})


def _good_result() -> dict:
    return to_nemo_gym_result(
        build_trajectory(session(), three_turn()), reward=1.0, responses_create_params={"input": []}
    ).row()


def _trainable(result: dict) -> list[dict]:
    return [it for it in result["response"]["output"] if it.get("generation_token_ids")]


def test_broken_exports_fail_with_the_defect_named():
    broken = _good_result()
    _trainable(broken)[2]["prompt_token_ids"][5] = 999  # a re-tokenized history
    [msg] = check_nemo_result(broken)
    assert "non-contiguous" in msg and "response.output[4]" in msg and "prompt_token_ids[5] is 999" in msg

    broken = _good_result()
    _trainable(broken)[1]["generation_log_probs"][0] = float("nan")
    [msg] = check_nemo_result(broken)
    assert "generation_log_probs[0] is not finite" in msg

    broken = _good_result()
    _trainable(broken)[0]["generation_log_probs"].pop()
    [msg] = check_nemo_result(broken)
    assert "mismatched lengths" in msg and "3 generation_token_ids but 2 generation_log_probs" in msg

    broken = _good_result()
    broken["reward_components"] = {"tests": 0.5, "format": 0.2}
    [msg] = check_nemo_result(broken)
    assert "reward_components sum to 0.7" in msg

    broken = _good_result()
    del broken["responses_create_params"]["input"]
    del broken["reward"]
    assert set(check_nemo_result(broken)) == {"missing 'reward'", "'responses_create_params' has no 'input'"}

    broken = _good_result()
    for it in broken["response"]["output"]:
        it.pop("generation_token_ids", None)
    assert "no trainable output item" in check_nemo_result(broken)[0]


class CharTokenizer:
    """A decoder for readable messages: token i is chr(i)."""

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


def test_group_with_differing_first_prompts_names_the_token_and_text():
    text = "You are a coding agent. Today is 2026-11-29."
    other = text.replace("29", "30")
    results = []
    for prompt in (text, text, other):
        ids = [ord(ch) for ch in prompt]
        calls = [call(0, ids, [1, 2])]
        results.append(
            to_nemo_gym_result(
                build_trajectory(session(), calls), reward=0.0, responses_create_params={"input": []}
            ).row()
        )
    assert check_group(results[:2]) == []
    [msg] = check_group(results, CharTokenizer())
    pos = text.index("29")
    assert f"rollout 2 differs from rollout 0 in its first prompt at token {pos} (50 vs 51" in msg
    assert "'2026-11-⟦29.⟧' vs '2026-11-⟦30.⟧'" in msg


def test_polar_file_round_trip_and_check_path(tmp_path: Path):
    path = tmp_path / "traj.jsonl"
    trajs = [
        _fragmented(),
        build_trajectory(
            session("s2"), [c.model_copy(update={"session_id": "s2"}) for c in three_turn()], reward=0.0
        ),
    ]
    with TrajectoryWriter(path) as writer:
        for t in trajs:
            writer.write(t)
            assert path.read_bytes().endswith(b"\n")  # flushed per episode
    assert [t.model_dump() for t in read_trajectories(path)] == [t.model_dump() for t in trajs]
    report = check_path(path)
    assert report.kind == "polar" and report.items == 2 and report.ok, report.render()
    assert any("compaction x1" in n for n in report.notes)

    nemo = tmp_path / "results.jsonl"
    write_jsonl(nemo, [to_nemo_gym_result(t, responses_create_params={"input": []}).row() for t in trajs])
    report = check_path(nemo)
    assert report.kind == "nemo" and report.ok, report.render()

    rows = grpo_rows(trajs)
    batch = tmp_path / "batch.jsonl"
    write_jsonl(batch, rows)
    report = check_path(batch)
    assert report.kind == "grpo" and report.items == len(rows) == 4 and report.ok, report.render()

    bad = [json.loads(line) for line in nemo.read_text().splitlines()]
    bad[1]["response"]["output"][2]["prompt_token_ids"] = [7, 7]
    write_jsonl(nemo, bad)
    report = check_path(nemo)
    assert not report.ok and "line 2: response.output[2]: non-contiguous" in report.render()


def test_trajectory_metadata_is_typed_keeps_the_callers_keys_and_writes_only_what_was_set(tmp_path: Path):
    """``Trajectory.metadata`` is ``TrajectoryMetadata``: Polar's keys typed (read as attributes), the
    session's own keys kept as given, a key written only where it was set (``None`` too, where set), so a
    line written before the model existed reads back the same and writes back the same."""
    traj = build_trajectory(session("s1", sample=2, mine={"x": [1]}), three_turn(), reward=1.0)
    meta = traj.metadata
    assert (meta.task_id, meta.sample, meta.model_extra) == ("t1", 2, {"mine": {"x": [1]}})
    meta.timings, meta.failure = EpisodeTimings(model_s=1.5), None
    written = json.loads(traj.model_dump_json())["metadata"]
    assert written == {
        "task_id": "t1",
        "group_id": "g1",
        "harness": "codex",
        "sample": 2,
        "logprobs_mode": "unknown",
        "timings": {"model_s": 1.5},
        "failure": None,
        "mine": {"x": [1]},
    }
    older = {**written, "duration_s": 3, "timings": {"model_s": 1}, "exploit_attempts": {"tests": []}}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps({**json.loads(traj.model_dump_json()), "metadata": older}) + "\n")
    (back,) = read_trajectories(path)
    assert back.metadata.duration_s == 3.0 and back.metadata.timings == EpisodeTimings(model_s=1.0)
    assert back.metadata.exploit_attempts == {"tests": []} and back.metadata.workspace is None
    assert json.loads(back.model_dump_json())["metadata"] == older


def test_grpo_advantages():
    assert grpo_advantages([1.0, 0.0, 0.0, 1.0]) == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert grpo_advantages([1.0, 1.0]) == [0.0, 0.0]  # no signal in a uniform group
    assert grpo_advantages([1.0, 0.0, 0.0], leave_one_out=True) == [1.0, -0.5, -0.5]
    assert grpo_advantages([3.0], leave_one_out=True) == [0.0]
    trajs = [build_trajectory(session(f"s{i}"), three_turn(), reward=r) for i, r in enumerate([1.0, 0.0])]
    rows = grpo_rows(trajs)
    assert [r["advantage"] for r in rows] == pytest.approx([1.0, -1.0], abs=1e-5)
    assert all(r["group_id"] == "g1" and r["main"] for r in rows)
    with pytest.raises(ValueError, match="without a reward"):
        grpo_rows([build_trajectory(session(), three_turn())])


class ReplayScorer:
    """Scores by looking the recorded logprobs up (plus a known offset): checks rescore's alignment."""

    def __init__(self, chain, offset: float = 0.0):
        self.chain, self.offset = chain, offset

    def score(self, ids: list[int], start: int) -> list[float]:
        assert ids == self.chain.input_ids
        return [
            lp + self.offset if m else -5.0
            for lp, m in zip(self.chain.logprobs[start:], self.chain.loss_mask[start:], strict=True)
        ]


def test_rescore_compares_only_sampled_positions():
    chain = build_trajectory(session(), three_turn()).chains[0]
    assert rescore(chain, ReplayScorer(chain)) == {"max_abs_diff": 0.0, "mean_abs_diff": 0.0, "tokens": 9.0}
    assert rescore(chain, ReplayScorer(chain, 0.25))["max_abs_diff"] == pytest.approx(0.25)


def test_custom_tool_call_tokens_ride_on_an_item_type_gym_can_train():
    calls = three_turn()
    patch = ToolCall(id="call_p", name="apply_patch", arguments="*** Begin Patch", kind="custom")
    calls[0] = calls[0].model_copy(
        update={"output": calls[0].output.model_copy(update={"tool_calls": [patch]})}
    )
    result = to_nemo_gym_result(
        build_trajectory(session(), calls), responses_create_params={"input": []}
    ).row()
    assert check_nemo_result(result) == []
    first = result["response"]["output"][:2]
    assert [it["type"] for it in first] == ["custom_tool_call", "message"]
    assert "generation_token_ids" not in first[0] and first[1]["generation_token_ids"] == [10, 11, 12]
    assert first[0]["input"] == "*** Begin Patch"

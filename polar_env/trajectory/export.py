"""Exports of trajectories: Polar's own JSONL, NeMo Gym ``/run`` results, flat GRPO batches.

Polar's file keeps every chain trainable. NeMo-RL asserts that the trainable items of one result
form a single contiguous sequence, so its export carries token ids for the main chain only
(``chains.main_chain_index``) and lists the other chains' turns as plain items. The GRPO batch is
for trainers that take one row per sequence: every chain of every trajectory, with a
group-normalised advantage.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from polar_env import fastjson
from polar_env.chat.messages import AssistantTurn, Message
from polar_env.trajectory.exploits import attempts_of
from polar_env.trajectory.models import CallSummary, Chain, Trajectory
from polar_env.trajectory.paths import Selector, policy_versions, train_chains
from polar_env.wire.nemo_gym import (
    InstanceConfig,
    PolarInfo,
    RunResponse,
    RunResult,
    RunUsage,
    TrainingTokens,
)
from polar_env.wire.openai_responses import FunctionCallOutput, InputMessage
from polar_env.wire.responses import message_item, output_items
from polar_env.wire.shape import UNSET, to_builtins

GRPO_ROW_SCHEMA = "polar.grpo_row.v1"
_TRAINABLE_TYPES = ("message", "function_call", "reasoning")  # Gym's *ForTraining item types


# -- (a) Polar trajectory files ------------------------------------------------------------------
class TrajectoryWriter:
    """Appends one trajectory a line as episodes end; each line is flushed before ``write`` returns."""

    def __init__(self, path: Path, *, fsync: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self._handle = open(self.path, "ab")  # noqa: SIM115 - one handle for the writer's life

    def write(self, trajectory: Trajectory) -> None:
        self._handle.write(trajectory.model_dump_json().encode() + b"\n")
        self._handle.flush()
        if self.fsync:
            os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


RUN_TRAJECTORIES = "trajectories.jsonl"  # what `polar rollout` and `polar train` write in a run's folder


def trajectory_file(path: Path) -> Path:
    """A run's folder stands for the trajectories file in it; a file for itself."""
    return path / RUN_TRAJECTORIES if path.is_dir() else path


def read_trajectories(path: Path) -> Iterator[Trajectory]:
    """Yield the trajectories of a Polar JSONL file; an unterminated last line (a write in
    flight) is skipped, any other bad line raises ``ValueError`` naming its line number."""
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    for number, line in enumerate(lines[:-1], start=1):
        if line.strip():
            try:
                yield Trajectory.model_validate_json(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not a Polar trajectory: {exc}") from exc


# -- (b) NeMo Gym / NeMo-RL /run result ----------------------------------------------------------
def to_nemo_gym_result(
    traj: Trajectory,
    *,
    reward: float | None = None,
    responses_create_params: dict[str, Any] | None = None,
    mask_sample: bool | None = None,
    reward_components: dict[str, float] | None = None,
    placeholder_token_id: int = 0,
    group_prompt: list[int] | None = None,
    arrays: bool = False,
) -> RunResult:
    """The ``/run`` result NeMo-RL's Gym actor consumes (docs/trajectories.md); written as its ``row()``.

    Output items follow the calls in order. A call of the main chain carries
    ``prompt_token_ids`` (the chain up to its sampled span), ``generation_token_ids`` and
    ``generation_log_probs`` on its last output item; every other call's items carry no token
    ids, so NeMo-RL skips them. ``reward`` and ``mask_sample`` (keep in the group baseline, no
    loss) default to the trajectory's own (its outcome-table verdict, polar_env.outcomes).

    A trajectory with no trainable token is never dropped (a dropped member shrinks its GRPO
    group): it carries one masked placeholder generation of ``placeholder_token_id`` (any id of
    the vocabulary; the agent server passes the model's EOS), ``mask_sample`` forced on. NeMo-RL
    groups by first-prompt ids, so its prompt is its own first prompt when it has one, else
    ``group_prompt`` (a sibling's: :class:`GroupPrompts`), so it stays in its task's group and
    baseline; with neither it is ``[placeholder_token_id]`` and ``polar.first_prompt`` says ``none``.

    Each call's ``prompt_token_ids`` repeats the whole chain before it (NeMo-RL checks every item's
    prompt against all earlier ids), so a 200-call, 100k-token episode holds ~10M ids. As lists
    that is ~60 ms of copying; ``arrays=True`` gives read-only numpy views of one array of the chain
    instead (no copy per call), for results that are only serialised (``jsonl_line`` or
    ``fastjson.dumps`` of ``row()``: the same JSON bytes).
    """
    if reward is None:
        reward = traj.reward if traj.reward is not None else 0.0
    if mask_sample is None:
        mask_sample = traj.masked
    main = traj.chains[traj.main_chain] if traj.main_chain is not None else None
    first_in_chain = {ch.call_indices[0] for ch in traj.chains}
    spans = {s.call_index: s for ch in traj.chains for s in ch.spans if s.kind in ("sampled", "unscored")}
    ids, logprobs = _token_sources(main, arrays) if main is not None else ([], [])
    output: list[dict[str, Any]] = []
    for call in traj.calls:
        if call.output is None or call.chain is None:
            continue
        if call.call_index not in first_in_chain:
            output.extend(_input_items(call.new_messages))
        items = to_builtins(output_items(call.output))  # the items the harness got, with the same ids
        span = spans.get(call.call_index)
        if main is not None and call.chain == main.index and span is not None and span.kind == "sampled":
            carrier = _token_carrier(items, call.output.call_id)
            carrier.update(
                TrainingTokens(
                    prompt_token_ids=ids[: span.start],
                    generation_token_ids=ids[span.start : span.end],
                    generation_log_probs=logprobs[span.start : span.end],
                    policy_version=UNSET if call.policy_version is None else call.policy_version,
                ).row()
            )
        output.extend(items)
    first_prompt = "own"
    if main is None:
        first = next((ch.first_prompt_ids() for ch in traj.chains), None)
        first_prompt = "own" if first else "sibling" if group_prompt else "none"
        first = first or group_prompt or [placeholder_token_id]
        output.append(
            {
                **to_builtins(message_item(f"{traj.session_id}_placeholder", "", status="incomplete")),
                **TrainingTokens(
                    prompt_token_ids=first,
                    generation_token_ids=[placeholder_token_id],
                    generation_log_probs=[0.0],
                ).row(),
            }
        )
        mask_sample = True
    params = dict(responses_create_params or {})
    if "input" not in params:
        params["input"] = _initial_input(traj)
    stats = traj.stats
    versions = stats.policy_versions
    attempted = list(attempts_of(traj))
    return RunResult(
        responses_create_params=params,
        response=RunResponse(
            id=f"resp_polar_{traj.session_id}",
            created_at=traj.created_at,
            model=traj.model,
            status="completed" if traj.status == "completed" else "incomplete",
            output=output,
            usage=_usage(traj),
        ),
        reward=float(reward),
        instance_config=InstanceConfig(mask_sample=bool(mask_sample)),
        num_turns=len(main.call_indices) if main is not None else 0,
        num_calls=stats.calls,
        num_failed_calls=stats.failed_calls,
        num_chains=stats.chains,
        sampled_tokens=stats.sampled_tokens,
        trainable_tokens=stats.main_chain_tokens,
        trainable_fraction=stats.main_chain_tokens / stats.sampled_tokens if stats.sampled_tokens else 0.0,
        all_chains_trainable_fraction=stats.trainable_fraction,
        unscored_tokens=stats.unscored_tokens,
        context_only_turns=stats.context_only_turns,
        unversioned_calls=stats.unversioned_calls,
        single_call=int(stats.single_call),
        timed_out=traj.status == "timeout",
        errored=traj.status == "error",
        failure_kind=traj.failure_kind.wire,
        polar=PolarInfo(
            session_id=traj.session_id,
            task_id=traj.task_id,
            group_id=traj.group_id,
            harness=traj.harness,
            status=traj.status,
            error=traj.error,
            failure_kind=traj.failure_kind.value,
            first_prompt=first_prompt,
            main_chain=traj.main_chain,
            breaks=[b.model_dump() for b in stats.breaks],
            policy_versions=versions,
            exploit_attempts=attempted,
        ),
        # numeric: NeMo-RL logs them per agent
        exploit_attempt=float(bool(attempted)),
        policy_version_min=versions[0] if versions else UNSET,
        policy_version_spread=versions[-1] - versions[0] if versions else UNSET,
        reward_components={str(k): float(v) for k, v in reward_components.items()}
        if reward_components
        else UNSET,
    )


def _token_sources(main: Chain, arrays: bool) -> tuple[Any, Any]:
    """What the carriers slice their ids and logprobs from: the chain's lists (a slice is a copy),
    or read-only numpy arrays (a slice is a view; read-only because every view shares one buffer)."""
    if not arrays:
        return main.input_ids, main.logprobs
    ids, logprobs = np.array(main.input_ids, dtype=np.int64), np.array(main.logprobs, dtype=np.float64)
    ids.flags.writeable = logprobs.flags.writeable = False
    return ids, logprobs


def _usage(traj: Trajectory) -> RunUsage:
    """Summed over every model call of the episode, as an API bills them: total = input + output."""
    prompt = sum(c.prompt_tokens for c in traj.calls)
    sampled = sum(c.sampled_tokens for c in traj.calls)
    return RunUsage(input_tokens=prompt, output_tokens=sampled, total_tokens=prompt + sampled)


def _token_carrier(items: list[dict[str, Any]], call_id: str) -> dict[str, Any]:
    """The last item of a call whose type Gym has a training variant for (message, function_call,
    reasoning); when there is none (only custom tool calls), an empty assistant message is added."""
    for item in reversed(items):
        if item["type"] in _TRAINABLE_TYPES:
            return item
    items.append(to_builtins(message_item(call_id, "")))
    return items[-1]


def _input_items(messages: list[Message]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            items.append(to_builtins(FunctionCallOutput(call_id=m.tool_call_id or "", output=m.content)))
        elif m.role == "assistant":
            turn = AssistantTurn(
                call_id="hist", content=m.content, reasoning=m.reasoning, tool_calls=m.tool_calls
            )
            items.extend(to_builtins(output_items(turn)))
        else:
            items.append(to_builtins(InputMessage(role=m.role, content=m.content)))
    return items


def _initial_input(traj: Trajectory) -> list[dict[str, Any]]:
    first: CallSummary | None = next((c for c in traj.calls if c.messages_offset == 0), None)
    return _input_items(first.new_messages) if first is not None else []


def group_key(traj: Trajectory) -> str:
    """Rollouts of one task are compared with each other: group_id, else task_id, else alone."""
    return traj.group_id or traj.task_id or traj.session_id


class GroupPrompts:
    """The first-prompt ids each group's rollouts reached the model with, for the placeholder of a
    sibling that failed before its first call (``to_nemo_gym_result(group_prompt=...)``). A task's
    first prompt is the same in every rollout (docs/harnesses.md), so any sibling's will do. Kept as
    int32 arrays, the ``max_groups`` most recently noted (a long-lived server sees every task)."""

    def __init__(self, trajectories: Iterable[Trajectory] = (), *, max_groups: int | None = None):
        self._ids: OrderedDict[str, np.ndarray] = OrderedDict()
        self.max_groups = max_groups
        for traj in trajectories:
            self.note(traj)

    def note(self, traj: Trajectory) -> None:
        if traj.main_chain is None:
            return
        key = group_key(traj)
        if key not in self._ids:
            self._ids[key] = np.array(traj.chains[traj.main_chain].first_prompt_ids(), dtype=np.int32)
        self._ids.move_to_end(key)
        while self.max_groups is not None and len(self._ids) > self.max_groups:
            self._ids.popitem(last=False)

    def get(self, traj: Trajectory) -> list[int] | None:
        ids = self._ids.get(group_key(traj))
        return ids.tolist() if ids is not None else None


def nemo_results(trajectories: list[Trajectory]) -> Iterator[RunResult]:
    """Every trajectory as its ``/run`` result, placeholders carrying their group's first prompt."""
    prompts = GroupPrompts(trajectories)
    for traj in trajectories:
        yield to_nemo_gym_result(traj, group_prompt=prompts.get(traj), arrays=True)


# -- (c) flat GRPO batch -------------------------------------------------------------------------


def grpo_advantages(rewards: list[float], *, leave_one_out: bool = False, eps: float = 1e-6) -> list[float]:
    """Group-normalised advantages.

    Default: ``A_i = (r_i - mean(r)) / (std(r) + eps)`` with the population std of the group.
    Leave-one-out: ``A_i = r_i - mean(r_j for j != i)`` (0.0 for a group of one).
    """
    n = len(rewards)
    if n == 0:
        return []
    if leave_one_out:
        if n == 1:
            return [0.0]
        total = sum(rewards)
        return [r - (total - r) / (n - 1) for r in rewards]
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
    return [(r - mean) / (std + eps) for r in rewards]


def grpo_rows(
    trajectories: Iterable[Trajectory],
    *,
    leave_one_out: bool = False,
    eps: float = 1e-6,
    train_paths: str | Selector = "all",
) -> list[dict[str, Any]]:
    """One row per chain ``train_paths`` selects (trajectory/paths.py) with a trainable token, with
    its trajectory's group advantage. A masked trajectory stays in its group's baseline and gives
    no row (NeMo-RL's ``mask_sample``): one failed sample never costs its siblings their rows."""
    trajs = list(trajectories)
    reward = {i: float(t.reward) for i, t in enumerate(trajs) if t.reward is not None}
    missing = [t.session_id for t in trajs if t.reward is None]
    if missing:
        raise ValueError(f"trajectories without a reward cannot get an advantage: {missing}")
    groups: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(trajs):
        groups[group_key(t)].append(i)
    advantage: dict[int, float] = {}
    for members in groups.values():
        values = grpo_advantages([reward[i] for i in members], leave_one_out=leave_one_out, eps=eps)
        advantage.update(zip(members, values, strict=True))
    rows = []
    for i, t in enumerate(trajs):
        for ch in train_chains(t, train_paths):
            rows.append(
                {
                    "schema": GRPO_ROW_SCHEMA,
                    "session_id": t.session_id,
                    "task_id": t.task_id,
                    "group_id": group_key(t),
                    "chain": ch.index,
                    "main": ch.index == t.main_chain,
                    "reward": reward[i],
                    "advantage": advantage[i],
                    "input_ids": ch.input_ids,
                    "loss_mask": ch.loss_mask,
                    "logprobs": ch.logprobs,
                    "policy_versions": policy_versions(t, ch),
                }
            )
    return rows


def thin_groups(trajectories: Iterable[Trajectory]) -> dict[str, int]:
    """Groups of several samples left with fewer than 2 unmasked ones -> how many they have: a
    failed sample is masked alone (its siblings still train), but one usable sample has no advantage."""
    usable: dict[str, int] = defaultdict(int)
    size: dict[str, int] = defaultdict(int)
    for t in trajectories:
        usable[group_key(t)] += not t.masked
        size[group_key(t)] += 1
    return {key: n for key, n in sorted(usable.items()) if n < 2 <= size[key]}


def jsonl_line(row: dict[str, Any]) -> bytes:
    """One export row as a JSONL line, through the hot-path codec: rows hold long id lists (a
    100k-token NeMo result is tens of MB of ints), and a row orjson refuses (a lone surrogate in a
    message) still gets written. numpy arrays (the views in ``to_nemo_gym_result(arrays=True).row()``)
    are written as lists."""
    return fastjson.dumps(row, newline=True)


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write dict rows as JSONL (NeMo results' ``row()``, GRPO rows); returns the number written."""
    n = 0
    with open(path, "wb") as handle:
        for row in rows:
            handle.write(jsonl_line(row))
            n += 1
    return n

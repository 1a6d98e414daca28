"""NeMo Gym's ``/run`` result, the one body NeMo-RL's GRPO loop reads per episode
(``trajectory/export.py`` fills :class:`RunResult`; the agent server extends it as
:class:`AgentRunResult`). docs/trajectories.md and docs/nemo.md document the keys.

The output items stay dicts: those that carry token ids may hold read-only numpy views
(``to_nemo_gym_result(arrays=True)``), which msgspec cannot encode and a list would copy (a
100k-token episode repeats ~10M ids). So a result is written as :meth:`Row.row` (the shapes as
dicts, the items as they are) through ``polar_env.fastjson``, which writes the views as lists.
"""

from __future__ import annotations

from typing import Any, Literal

from polar_env.wire.openai_responses import InputTokensDetails, OutputTokensDetails
from polar_env.wire.shape import UNSET, Shape, UnsetType


def _builtins(shape: Shape) -> dict[str, Any]:
    """The struct's set fields, nested shapes as dicts, everything else as it is (no copy)."""
    out: dict[str, Any] = {}
    for name in shape.__struct_fields__:
        value = getattr(shape, name)
        if value is not UNSET:
            out[name] = _builtins(value) if isinstance(value, Shape) else value
    return out


class Row(Shape):
    """A shape of the result, written as :meth:`row` (its fields may hold numpy arrays)."""

    def row(self) -> dict[str, Any]:
        """What the writers serialise (``fastjson.dumps``, ``jsonl_line``): ``to_builtins``'s dict,
        except that dict and list fields are the very objects the shape holds, numpy views and all."""
        return _builtins(self)


class TrainingTokens(Row):
    """What NeMo Gym's training variant of an output item adds to it: the call's prompt (the chain
    up to its sampled span), its sampled ids and their logprobs; lists or numpy views."""

    prompt_token_ids: Any
    generation_token_ids: Any
    generation_log_probs: Any
    policy_version: int | UnsetType = UNSET  # a field NeMo-RL does not read: who sampled the turn


class RunUsage(Row):
    """Summed over every model call of the episode; in the order the exports have always written
    (``openai_responses.Usage`` orders its keys as OpenAI's answer does)."""

    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()


class RunResponse(Row):
    id: str
    object: Literal["response"] = "response"
    created_at: float
    model: str
    status: Literal["completed", "incomplete"]
    output: list[dict[str, Any]]  # Responses-API items; the main chain's carry token ids (maybe numpy views)
    parallel_tool_calls: bool = True
    tool_choice: str = "auto"
    tools: list[Any] = []
    usage: RunUsage


class InstanceConfig(Row):
    mask_sample: bool  # keep in the GRPO group's baseline, no loss


class PolarInfo(Row):
    """Polar's own record of the episode (NeMo-RL passes it through)."""

    session_id: str
    task_id: str | None
    group_id: str | None
    harness: str | None
    status: Literal["completed", "timeout", "error"]
    error: str | None
    failure_kind: str  # the bare kind (``none`` for a clean run)
    first_prompt: Literal["own", "sibling", "none"]  # whose first prompt the result groups by
    main_chain: int | None
    breaks: list[dict[str, Any]]
    policy_versions: list[int]
    exploit_attempts: list[str] | UnsetType = (
        UNSET  # the classes the episode's tool calls attempted (trajectory/exploits.py)
    )
    timings: dict[str, float] | UnsetType = UNSET  # the agent server's stages
    model_call_latency_ms: dict[str, float] | UnsetType = UNSET  # the agent server's latency summary


class RunResult(Row):
    """One episode as NeMo-RL's Gym actor consumes it. The top-level numbers are per-agent metrics."""

    responses_create_params: dict[str, Any]
    response: RunResponse
    reward: float
    instance_config: InstanceConfig
    num_turns: int
    num_calls: int
    num_failed_calls: int
    num_chains: int
    sampled_tokens: int
    trainable_tokens: int
    trainable_fraction: float  # the main chain's share of all sampled tokens
    all_chains_trainable_fraction: float
    unscored_tokens: int
    context_only_turns: int  # answered calls without aligned logprobs: kept as context, mask 0
    unversioned_calls: int  # answered calls no weight version is known for (docs/nemo.md)
    single_call: int  # 1 when the harness made one answered call (a degenerate agentic rollout)
    timed_out: bool
    errored: bool
    failure_kind: str | None  # ``polar:<kind>``; null for a clean run
    polar: PolarInfo
    exploit_attempt: float | UnsetType = (
        UNSET  # 1.0 where the tool calls attempted an exploit (its mean: the rate)
    )
    policy_version_min: int | UnsetType = UNSET  # when a policy version sampled any call
    policy_version_spread: int | UnsetType = UNSET
    reward_components: dict[str, float] | UnsetType = UNSET


class AgentRunResult(RunResult):
    """The agent server's ``/run`` answer: the export, its verdict and Gym's observability records."""

    mask_sample: bool
    resolved: bool
    task_id: str
    failure_reason: str | None
    failure: dict[str, Any] | None  # ``failures.EpisodeFailure``
    harness_exit_code: int | None
    duration_s: float
    seed_s: float
    harness_s: float
    grading_s: float
    model_call_p50_ms: float
    model_call_p95_ms: float
    ng_agent_observations: dict[str, Any]
    ng_trajectory: dict[str, Any]

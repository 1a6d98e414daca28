"""Contract and fidelity checks on exported training data.

NeMo-RL aborts a whole batch on one non-contiguous result and silently gives zero advantage to
groups whose first prompts differ; these checks find both before a trainer does, and name the
item, token position and text where things go wrong.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, TypeGuard

import numpy as np
from pydantic import BaseModel, BeforeValidator, Field, StrictBool, StrictFloat, StrictInt, ValidationError

from polar_env.trajectory import exploits
from polar_env.trajectory.export import thin_groups, to_nemo_gym_result, trajectory_file
from polar_env.trajectory.models import Chain, Trajectory
from polar_env.trajectory.records import HISTORY_THINKING_KEPT
from polar_env.wire.loose import Loose

FileKind = Literal["polar", "nemo", "grpo", "ledger", "unknown"]


class Scorer(Protocol):
    def score(self, ids: list[int], start: int) -> list[float]:
        """Logprobs of ``ids[start:]``, each given the tokens before it."""
        ...


class Decoder(Protocol):
    def decode(self, ids: list[int]) -> str: ...


class CheckReport(BaseModel):
    path: str
    kind: FileKind
    items: int = 0
    defects: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)  # not defects: the file is valid, but loses something
    exploits: list[str] = Field(
        default_factory=list
    )  # attempts the episodes' tool calls made (trajectory/exploits.py)
    rescore: dict[str, float] | None = None

    @property
    def ok(self) -> bool:
        return not self.defects

    def render(self) -> str:
        what = "ledger directory" if self.kind == "ledger" else f"{self.kind} file"
        lines = [f"{self.path}: {what}, {self.items} item(s)"]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  WARNING: {w}" for w in self.warnings]
        if self.exploits:
            lines.append("  EXPLOIT ATTEMPTS (an instrument, not a reward rule: docs/trajectories.md):")
            lines += [f"    {e}" for e in self.exploits]
        if self.rescore is not None:
            r = self.rescore
            lines.append(
                f"  rescore: {int(r['tokens'])} tokens, max |diff| {r['max_abs_diff']:.3g}, "
                f"mean |diff| {r['mean_abs_diff']:.3g}"
            )
        lines += [f"  DEFECT: {d}" for d in self.defects]
        lines.append("  OK" if self.ok else f"  {len(self.defects)} defect(s)")
        return "\n".join(lines)


# -- NeMo-RL contract ----------------------------------------------------------------------------
def _is_trainable(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    ids = item.get("generation_token_ids")
    return bool(len(ids)) if isinstance(ids, np.ndarray) else bool(ids)


def _int_list(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value)


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


Number = StrictInt | StrictFloat  # JSON numbers; a bool is not one


class _Params(Loose):
    input: Any


class _Response(Loose):
    output: list[Any]


class _InstanceConfig(Loose):
    mask_sample: StrictBool = False


class NemoResult(Loose):
    """The ``/run`` result fields NeMo-RL's Gym actor reads (extra numeric keys are its metrics)."""

    reward: Number
    responses_create_params: _Params
    response: _Response
    reward_components: dict[str, Number] | None = None
    instance_config: _InstanceConfig | None = None


def _as_list(value: Any) -> Any:
    """The numpy views of an in-memory export (``to_nemo_gym_result(arrays=True)``) as the lists they
    serialise to."""
    return value.tolist() if isinstance(value, np.ndarray) else value


class TrainableItem(Loose):
    """An output item that carries token ids: what NeMo-RL turns into a training sample."""

    prompt_token_ids: Annotated[list[StrictInt], BeforeValidator(_as_list)]
    generation_token_ids: Annotated[list[StrictInt], BeforeValidator(_as_list)]
    # a NaN written as JSON null: reported by position below
    generation_log_probs: Annotated[list[Number | None], BeforeValidator(_as_list)]


# what a validation error at a field means, in NeMo-RL's terms
_RESULT_DEFECTS = {
    ("reward",): lambda raw: (
        "missing 'reward'" if "reward" not in raw else f"'reward' is not a finite number: {raw['reward']!r}"
    ),
    ("responses_create_params",): lambda raw: "missing 'responses_create_params'",
    ("responses_create_params", "input"): lambda raw: "'responses_create_params' has no 'input'",
    ("response",): lambda raw: "missing 'response.output' list",
    ("reward_components",): lambda raw: "'reward_components' must map names to finite numbers",
    ("instance_config",): lambda raw: "'instance_config' is not an object",
    ("instance_config", "mask_sample"): lambda raw: (
        f"instance_config.mask_sample is not a bool: {raw['instance_config']['mask_sample']!r}"
    ),
}
_ITEM_DEFECTS = {
    "prompt_token_ids": "'prompt_token_ids' missing or not a list of ints",
    "generation_token_ids": "'generation_token_ids' is not a list of ints",
    "generation_log_probs": "'generation_log_probs' missing or not a list of numbers",
}


def _defect_at(loc: tuple, table: dict) -> Any:
    """The entry of ``table`` for the longest leading part of an error location."""
    keys = [str(part) for part in loc if not isinstance(part, int)]
    for n in range(len(keys), 0, -1):
        if tuple(keys[:n]) in table:
            return table[tuple(keys[:n])]
    return None


def check_nemo_result(result: dict[str, Any]) -> list[str]:
    """Everything NeMo-RL's Gym actor asserts or relies on for one ``/run`` result."""
    if not isinstance(result, dict):
        return ["result is not a JSON object"]
    defects: list[str] = []
    try:
        parsed: NemoResult | None = NemoResult.model_validate(result)
    except ValidationError as exc:
        parsed = None
        for error in exc.errors():
            name = _defect_at(error["loc"], _RESULT_DEFECTS)
            message = name(result) if name else f"{'.'.join(map(str, error['loc']))}: {error['msg']}"
            if message not in defects:
                defects.append(message)
    if parsed is not None and not math.isfinite(parsed.reward):
        defects.append(f"'reward' is not a finite number: {parsed.reward!r}")
    response = result.get("response")
    output = response.get("output") if isinstance(response, dict) else None
    seen: list[int] = []
    trainable = 0
    for i, raw in enumerate(output if isinstance(output, list) else []):
        if not _is_trainable(raw):
            continue
        trainable += 1
        where = f"response.output[{i}]"
        try:
            item = TrainableItem.model_validate(raw)
        except ValidationError as exc:
            defects.append(f"{where}: {_ITEM_DEFECTS[str(exc.errors()[0]['loc'][0])]}")
            continue
        prompt, gen, lps = item.prompt_token_ids, item.generation_token_ids, item.generation_log_probs
        if len(lps) != len(gen):
            defects.append(
                f"{where}: mismatched lengths: {len(gen)} generation_token_ids but "
                f"{len(lps)} generation_log_probs"
            )
        else:
            bad = next((j for j, x in enumerate(lps) if x is None or not math.isfinite(x)), None)
            if bad is not None:
                defects.append(f"{where}: generation_log_probs[{bad}] is not finite ({lps[bad]!r})")
        if prompt[: len(seen)] != seen:
            pos = _first_difference(seen, prompt)
            got = prompt[pos] if pos < len(prompt) else "end of prompt"
            defects.append(
                f"{where}: non-contiguous: prompt_token_ids[{pos}] is {got}, but the earlier "
                f"prompt+generation has {seen[pos]} there (prompt length {len(prompt)}, "
                f"{len(seen)} tokens seen)"
            )
        seen = prompt + gen
    if not trainable:
        defects.append(
            "no trainable output item (no item with generation_token_ids): NeMo-RL raises "
            "'no generation data'"
        )
    components = parsed.reward_components if parsed is not None else None
    if parsed is not None and components:
        if not all(math.isfinite(v) for v in components.values()):
            defects.append("'reward_components' must map names to finite numbers")
        else:
            total = sum(components.values())
            if not math.isclose(total, parsed.reward, rel_tol=1e-5, abs_tol=1e-6):
                defects.append(f"reward_components sum to {total}, not reward {parsed.reward}")
    return defects


# -- group integrity -----------------------------------------------------------------------------
def first_prompt_ids(result: dict[str, Any] | Trajectory) -> list[int] | None:
    """What GRPO groups are keyed on: the prompt of the first trainable turn."""
    if isinstance(result, Trajectory):
        return result.chains[result.main_chain].first_prompt_ids() if result.main_chain is not None else None
    if "response" in result:
        for item in (result.get("response") or {}).get("output") or []:
            if _is_trainable(item):
                ids = item.get("prompt_token_ids")
                return _as_list(ids) if ids is not None and len(ids) else []
        return None
    if "input_ids" in result and "loss_mask" in result:
        mask = result["loss_mask"]
        return list(result["input_ids"][: mask.index(1)]) if 1 in mask else None
    if "chains" in result:
        return first_prompt_ids(Trajectory.model_validate(result))
    return None


def nemo_rl_groups(prompts: list[list[int] | None]) -> list[list[int]]:
    """The samples (indices into ``prompts``) NeMo-RL gives one GRPO baseline: those whose first-prompt
    token ids are equal. NeMo-RL's rule, reproduced: ``calculate_baseline_and_std_per_prompt`` in
    nemo_rl/algorithms/utils.py takes ``torch.unique(prompts, dim=0)`` over the batch's prompt ids and
    forms each baseline over the samples equal to one unique row. A sample with no prompt is alone."""
    groups: dict[tuple[int, ...] | int, list[int]] = {}
    for i, ids in enumerate(prompts):
        groups.setdefault(tuple(ids) if ids is not None else -1 - i, []).append(i)
    return list(groups.values())


def check_group(
    results: list[dict[str, Any] | Trajectory], tokenizer: Decoder | None = None, *, label: str = "group"
) -> list[str]:
    """All rollouts of one task must share their first prompt token for token, else GRPO
    silently makes each a group of one. Names the first differing position (and the text there
    when a tokenizer is given)."""
    prompts = [(i, first_prompt_ids(r)) for i, r in enumerate(results)]
    prompts = [(i, p) for i, p in prompts if p is not None]
    if len(prompts) < 2:
        return []
    ref_i, ref = prompts[0]
    defects = []
    for i, p in prompts[1:]:
        if p == ref:
            continue
        pos = _first_difference(ref, p)
        msg = (
            f"{label}: rollout {i} differs from rollout {ref_i} in its first prompt at token {pos} "
            f"({_tok(ref, pos)} vs {_tok(p, pos)}; lengths {len(ref)} vs {len(p)})"
        )
        if tokenizer is not None:
            msg += f": {_context(tokenizer, ref, pos)!r} vs {_context(tokenizer, p, pos)!r}"
        else:
            msg += " (pass --tokenizer DIR for the text there)"
        defects.append(msg + "; NeMo-RL would split the task's group")
    return defects


def check_group_sizes(sizes: dict[str, int], samples: int | None = None) -> list[str]:
    """Every task of a run has ``samples`` rollouts (GRPO's group size); without ``samples``, as many as
    the run's other tasks. A group short of one (an episode dropped from the file, a sample lost) gets a
    wrong baseline in NeMo-RL and no error."""
    if not sizes:
        return []
    if samples is not None:
        return [
            f"task {key}: {n} rollout(s) but the run's --samples is {samples} (a missing or extra episode: "
            f"its GRPO group and baseline are wrong)"
            for key, n in sizes.items()
            if n != samples
        ]
    counts = defaultdict(int)
    for n in sizes.values():
        counts[n] += 1
    usual = max(counts, key=lambda n: (counts[n], n))
    return [
        f"task {key}: {n} rollout(s) where the run's other tasks have {usual} (a dropped or extra episode: "
        f"unequal GRPO groups; pass --samples N to check against the run's)"
        for key, n in sizes.items()
        if n != usual
    ]


def _tok(ids: list[int], pos: int) -> str:
    return str(ids[pos]) if pos < len(ids) else "end"


def _context(tokenizer: Decoder, ids: list[int], pos: int, width: int = 8) -> str:
    return (
        tokenizer.decode(ids[max(0, pos - width) : pos])
        + "⟦"
        + tokenizer.decode(ids[pos : pos + width])
        + "⟧"
    )


def _first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


# -- trajectories --------------------------------------------------------------------------------
def check_trajectory(traj: Trajectory) -> list[str]:
    """Internal consistency of a Polar trajectory, and that its NeMo export passes the contract."""
    defects = []
    for ch in traj.chains:
        where = f"session {traj.session_id} chain {ch.index}"
        n = len(ch.input_ids)
        if not (len(ch.loss_mask) == len(ch.logprobs) == n):
            defects.append(
                f"{where}: mismatched lengths: {n} input_ids, {len(ch.loss_mask)} loss_mask, "
                f"{len(ch.logprobs)} logprobs"
            )
            continue
        pos = 0
        for s in ch.spans:
            if s.start != pos or s.end < s.start:
                defects.append(f"{where}: spans do not tile input_ids at {pos}")
                break
            want = 1 if s.kind == "sampled" else 0
            if any(m != want for m in ch.loss_mask[s.start : s.end]):
                defects.append(f"{where}: loss mask is not {want} on {s.kind} span {s.start}:{s.end}")
            pos = s.end
        else:
            if pos != n:
                defects.append(f"{where}: spans cover {pos} of {n} tokens")
        bad = next((j for j, x in enumerate(ch.logprobs) if not math.isfinite(x)), None)
        if bad is not None:
            defects.append(f"{where}: logprobs[{bad}] is not finite")
        nonzero = next(
            (
                j
                for j, (m, x) in enumerate(zip(ch.loss_mask, ch.logprobs, strict=True))
                if m == 0 and x != 0.0
            ),
            None,
        )
        if nonzero is not None:
            defects.append(f"{where}: masked position {nonzero} has a nonzero logprob")
    defects += duplicate_turns(traj)
    if sum(ch.trainable_tokens for ch in traj.chains) != traj.stats.trainable_tokens:
        defects.append(f"session {traj.session_id}: stats.trainable_tokens disagrees with the chains")
    if traj.main_chain is not None:
        result = to_nemo_gym_result(traj, reward=traj.reward or 0.0).row()
        defects += [f"session {traj.session_id} NeMo export: {d}" for d in check_nemo_result(result)]
    return defects


def duplicate_turns(traj: Trajectory) -> list[str]:
    """Calls whose appended messages re-render a tool call their chain already sampled.

    Token-exact extension alone cannot see this: when one sampled turn reaches the proxy split in
    two (Codex's interleaved call A, output A, call B, output B), the prompt still starts with the
    parent's ids, then renders call B a second time after output A. The model never saw that
    prompt, so training on it is silent corruption.
    """
    defects = []
    sampled: dict[int, dict[str, int]] = defaultdict(dict)  # chain -> tool-call id -> call that sampled it
    for call in sorted(traj.calls, key=lambda c: c.call_index):
        if call.chain is None:
            continue
        seen = sampled[call.chain]
        if call.parent_call_index is not None and call.messages_offset > 0:
            again = [
                tc.id
                for m in call.new_messages
                if m.role == "assistant"
                for tc in m.tool_calls
                if tc.id in seen
            ]
            if again:
                defects.append(
                    f"session {traj.session_id} call {call.call_index}: its prompt re-renders tool "
                    f"call(s) {', '.join(again)} that call {seen[again[0]]} already sampled in chain "
                    f"{call.chain} (one sampled turn decoded as two)"
                )
        for tc in call.output.tool_calls if call.output else []:
            seen[tc.id] = call.call_index
    return defects


# -- fidelity ------------------------------------------------------------------------------------
def rescore(traj_or_chain: Trajectory | Chain, backend: Scorer) -> dict[str, float]:
    """Re-score each trainable chain in one forward pass and compare with the recorded logprobs
    on its sampled positions."""
    chains = traj_or_chain.chains if isinstance(traj_or_chain, Trajectory) else [traj_or_chain]
    diffs: list[float] = []
    for ch in chains:
        if not ch.trainable_tokens:
            continue
        start = ch.loss_mask.index(1)
        scored = backend.score(ch.input_ids, start)
        if len(scored) != len(ch.input_ids) - start:
            raise ValueError(
                f"score() returned {len(scored)} logprobs for {len(ch.input_ids) - start} tokens"
            )
        for j in range(start, len(ch.input_ids)):
            if ch.loss_mask[j]:
                diffs.append(abs(float(scored[j - start]) - ch.logprobs[j]))
    return {
        "max_abs_diff": max(diffs, default=0.0),
        "mean_abs_diff": sum(diffs) / len(diffs) if diffs else 0.0,
        "tokens": float(len(diffs)),
    }


# -- files ---------------------------------------------------------------------------------------
def detect_kind(path: Path) -> FileKind:
    path = Path(path)
    if path.is_dir():
        return "ledger" if (path / "sessions").is_dir() else "unknown"
    with open(path, "rb") as handle:
        for line in handle:
            if line.strip():
                try:
                    obj = json.loads(line)
                except ValueError:
                    return "unknown"
                if not isinstance(obj, dict):
                    return "unknown"
                if "responses_create_params" in obj or "response" in obj:
                    return "nemo"
                if "chains" in obj and "schema_version" in obj:
                    return "polar"
                if "input_ids" in obj and "loss_mask" in obj:
                    return "grpo"
                return "unknown"
    return "unknown"


def check_path(
    path: Path, *, tokenizer: Decoder | None = None, scorer: Scorer | None = None, samples: int | None = None
) -> CheckReport:
    """Detect what ``path`` holds (Polar trajectories, NeMo results, GRPO rows, a ledger
    directory) and run the checks that apply; ``scorer`` adds the fidelity re-score, ``samples``
    (the run's rollouts per task) the group-size check against it."""
    path = Path(path)
    if path.is_dir() and trajectory_file(path).is_file():  # a run's folder; a ledger directory stays itself
        path = trajectory_file(path)
    kind = detect_kind(path)
    report = CheckReport(path=str(path), kind=kind)
    if kind == "unknown":
        report.defects.append(
            "not a Polar trajectory file, NeMo results file, GRPO batch or ledger directory"
        )
        return report
    if kind == "ledger":
        trajs = _ledger_trajectories(path, report)
    elif kind == "polar":
        trajs = []
        for number, obj in _json_lines(path, report):
            try:
                trajs.append(Trajectory.model_validate(obj))
            except ValueError as exc:
                report.defects.append(f"line {number}: not a valid trajectory: {str(exc).splitlines()[0]}")
    else:
        trajs = None
    if trajs is not None:
        _check_trajectories(trajs, report, tokenizer, scorer, samples)
    elif kind == "nemo":
        rows = _json_lines(path, report)
        report.items = len(rows)
        for number, obj in rows:
            report.defects += [f"line {number}: {d}" for d in check_nemo_result(obj)]
        _check_groups(
            [(_nemo_group(obj), obj) for _, obj in rows],
            report,
            tokenizer,
            samples=samples,
            reached=lambda o: (o.get("polar") or {}).get("first_prompt") != "none",
            called=lambda o: _finite_number(o.get("num_calls")) and o["num_calls"] > 0,
        )
        _note_policy_versions(
            [
                (
                    (obj.get("polar") or {}).get("policy_versions") or [],
                    int(obj.get("unversioned_calls") or 0),
                )
                for _, obj in rows
            ],
            report,
        )
        _note_capture_rules(
            [
                (
                    int(o.get("single_call") or 0),
                    int(o.get("context_only_turns") or 0),
                    bool((o.get("instance_config") or {}).get("mask_sample")),
                )
                for _, o in rows
            ],
            report,
        )
        # each result carries its episode's trainable tokens in every chain and in the main chain
        numbers = [
            o
            for _, o in rows
            if all(
                _finite_number(o.get(k))
                for k in ("sampled_tokens", "trainable_tokens", "all_chains_trainable_fraction")
            )
        ]
        everywhere = sum(round(o["all_chains_trainable_fraction"] * o["sampled_tokens"]) for o in numbers)
        _warn_side_chains(
            report, everywhere - sum(int(o["trainable_tokens"]) for o in numbers), everywhere, "trainable"
        )
    else:
        rows = _json_lines(path, report)
        report.items = len(rows)
        for number, obj in rows:
            report.defects += [f"line {number}: {d}" for d in _check_grpo_row(obj)]
        _check_groups(
            [(str(obj.get("group_id")), obj) for _, obj in rows if obj.get("main")], report, tokenizer
        )
        if scorer is not None:
            chains = [
                Chain(
                    index=0,
                    call_indices=[],
                    start_reason="",
                    input_ids=o["input_ids"],
                    loss_mask=o["loss_mask"],
                    logprobs=o["logprobs"],
                    spans=[],
                )
                for _, o in rows
            ]
            _add_rescore(chains, scorer, report)
    return report


def _check_trajectories(
    trajs: list[Trajectory],
    report: CheckReport,
    tokenizer: Decoder | None,
    scorer: Scorer | None,
    samples: int | None = None,
) -> None:
    report.items = len(trajs)
    sampled = sum(t.stats.sampled_tokens for t in trajs)
    trainable = sum(t.stats.trainable_tokens for t in trajs)
    main = sum(t.stats.main_chain_tokens for t in trajs)
    if sampled:
        report.notes.append(
            f"{sampled} sampled tokens; {trainable / sampled:.1%} trainable in Polar's format, "
            f"{main / sampled:.1%} in the NeMo-RL export (main chains)"
        )
    side = sum(ch.sampled_tokens for t in trajs for ch in t.chains if ch.index != t.main_chain)
    _warn_side_chains(report, side, sampled, "sampled")
    reasons: dict[str, int] = defaultdict(int)
    for t in trajs:
        for b in t.stats.breaks:
            reasons[b.reason] += 1
        report.defects += check_trajectory(t)
    if reasons:
        report.notes.append("chain breaks: " + ", ".join(f"{r} x{n}" for r, n in sorted(reasons.items())))
    _note_history_thinking(trajs, report)
    report.exploits = exploits.report_lines(trajs)
    _check_groups(
        [(t.group_id, t) for t in trajs],
        report,
        tokenizer,
        samples=samples,
        reached=lambda t: t.main_chain is not None,
        called=lambda t: t.stats.calls > 0,
    )
    _note_policy_versions([(t.stats.policy_versions, t.stats.unversioned_calls) for t in trajs], report)
    _note_capture_rules(
        [(int(t.stats.single_call), t.stats.context_only_turns, t.masked) for t in trajs], report
    )
    if thin := thin_groups(t for t in trajs if t.group_id is not None):
        report.warnings.append(
            f"{len(thin)} group(s) with fewer than 2 unmasked samples train nothing: "
            + ", ".join(f"{key} ({n})" for key, n in thin.items())
        )
    if scorer is not None:
        _add_rescore([ch for t in trajs for ch in t.chains], scorer, report)


def _note_history_thinking(trajs: list[Trajectory], report: CheckReport) -> None:
    """The declared difference from a full render: calls that kept earlier thinking after a new
    user turn (``--history-thinking keep``, docs/proxy.md), counted per episode."""
    per = {t.session_id: n for t in trajs if (n := sum(HISTORY_THINKING_KEPT in c.flags for c in t.calls))}
    if per:
        report.notes.append(
            f"declared render differences (earlier thinking kept after a new user turn, "
            f"--history-thinking keep): {sum(per.values())} call(s) in {len(per)} episode(s): "
            + ", ".join(f"{s} x{n}" for s, n in per.items())
        )


def _note_policy_versions(per_episode: list[tuple[list[int], int]], report: CheckReport) -> None:
    """Per run: how many policy versions sampled each episode, and how far its oldest is behind the newest;
    calls no version is known for are counted, so "no versions" never reads as "no spread"."""
    known = [v for v, _ in per_episode if v]
    unversioned = sum(n for _, n in per_episode)
    episodes = sum(1 for _, n in per_episode if n)
    if not known:
        if unversioned:
            report.notes.append(
                f"policy versions: none recorded ({unversioned} answered call(s) in {episodes} "
                "episode(s) unversioned: the inference server reports no weight version and no "
                "trainer set one), so whether an episode spans an update is unknown (docs/nemo.md)"
            )
        return
    newest = max(v[-1] for v in known)
    spreads = [v[-1] - v[0] for v in known]
    lags = [newest - v[0] for v in known]
    report.notes.append(
        f"policy versions {min(v[0] for v in known)}..{newest} over {len(known)} episode(s): spread within "
        f"an episode max {max(spreads)}, {sum(s > 0 for s in spreads)} span an update; lag behind the newest "
        f"max {max(lags)}, mean {sum(lags) / len(lags):.2f}"
        + (f"; {unversioned} answered call(s) in {episodes} episode(s) unversioned" if unversioned else "")
    )


def _note_capture_rules(per_episode: list[tuple[int, int, bool]], report: CheckReport) -> None:
    """OpenEnv RFC 006's capture rules, counted: agentic rollouts of one model call (degenerate; masked
    only where the run asked, ``--mask-single-call``) and turns kept as context for want of aligned
    logprobs."""
    single = [masked for one, _, masked in per_episode if one]
    if single:
        unmasked = sum(not m for m in single)
        report.warnings.append(
            f"{len(single)} rollout(s) made a single model call (a degenerate agentic rollout, OpenEnv RFC "
            "006): "
            + (
                f"{unmasked} of them trained on (mask them with --mask-single-call / mask_single_call)"
                if unmasked
                else "all masked"
            )
        )
    turns = sum(n for _, n, _ in per_episode)
    if turns:
        report.notes.append(
            f"{turns} turn(s) in {sum(1 for _, n, _ in per_episode if n)} episode(s) had no aligned "
            "logprobs: kept as context (loss mask 0), never trained on"
        )


def _warn_side_chains(report: CheckReport, side: int, total: int, what: str) -> None:
    """NeMo-RL trains one contiguous chain per episode (the main one); tokens elsewhere are lost to it."""
    if side > 0 and total:
        report.warnings.append(
            f"{side} of {total} {what} tokens ({side / total:.1%}) sit in chains NeMo-RL will "
            "not train (it trains each episode's main chain only; Polar's trajectory file and "
            "GRPO batch keep them)"
        )


def _add_rescore(chains: list[Chain], scorer: Scorer, report: CheckReport) -> None:
    total = {"max_abs_diff": 0.0, "sum": 0.0, "tokens": 0.0}
    for ch in chains:
        r = rescore(ch, scorer)
        total["max_abs_diff"] = max(total["max_abs_diff"], r["max_abs_diff"])
        total["sum"] += r["mean_abs_diff"] * r["tokens"]
        total["tokens"] += r["tokens"]
    report.rescore = {
        "max_abs_diff": total["max_abs_diff"],
        "tokens": total["tokens"],
        "mean_abs_diff": total["sum"] / total["tokens"] if total["tokens"] else 0.0,
    }


def _check_groups(
    keyed: list[tuple[str | None, Any]],
    report: CheckReport,
    tokenizer: Decoder | None,
    *,
    samples: int | None = None,
    reached: Callable[[Any], bool] | None = None,
    called: Callable[[Any], bool] | None = None,
) -> None:
    """Per task: one first prompt (else NeMo-RL splits the group), the run's group size (``reached``:
    whether a member got an answer from the model; a group none of whose members did is unusable;
    ``called``: whether it made a call at all, cut off or failed). Without a tokenizer, the one of
    the model the file names is tried for the text at a difference."""
    groups: dict[str, list[Any]] = defaultdict(list)
    for key, obj in keyed:
        if key is not None:
            groups[key].append(obj)
    for key, members in groups.items():
        defects = check_group(members, tokenizer, label=f"task {key}")
        if defects and tokenizer is None and (tokenizer := _model_decoder(members)) is not None:
            defects = check_group(members, tokenizer, label=f"task {key}")
        report.defects += defects
    if reached is not None:
        report.defects += check_group_sizes({key: len(members) for key, members in groups.items()}, samples)
        unusable = [key for key, members in groups.items() if not any(map(reached, members))]
        if unusable:
            cut = sum(map(called, (m for key in unusable for m in groups[key]))) if called is not None else 0
            why = (
                f"no rollout got an answer from the model ({cut} made a model call that ended unanswered, "
                "cut off in flight or failed: see their failure_kind)"
                if cut
                else "no rollout reached the model"
            )
            report.warnings.append(
                f"{len(unusable)} group(s) unusable, {why} (their masked placeholders train "
                f"nothing): {', '.join(unusable[:10])}"
            )
    if groups:
        report.notes.append(
            f"{len(groups)} group(s) checked for identical first prompts"
            + (" and equal sizes" if reached is not None else "")
        )


def _model_decoder(members: list[Any]) -> Decoder | None:
    """The tokenizer of the model that produced ``members``, when it is on this machine: the embedded
    model, or a Hugging Face name in the local cache (nothing is downloaded)."""
    name = next(
        (m.model if isinstance(m, Trajectory) else (m.get("response") or {}).get("model") for m in members),
        None,
    )
    if not isinstance(name, str) or not name:
        return None
    try:
        from transformers import AutoTokenizer

        from polar_env.backends.embedded import EMBEDDED_MODEL_NAME, embedded_model_dir

        if name == EMBEDDED_MODEL_NAME:
            return AutoTokenizer.from_pretrained(embedded_model_dir())
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception:  # noqa: BLE001 - the text is a courtesy; the defect stands without it
        return None


def _nemo_group(obj: dict[str, Any]) -> str | None:
    polar = obj.get("polar") or {}
    for key in (polar.get("group_id"), polar.get("task_id"), obj.get("_ng_task_index"), obj.get("task_id")):
        if key is not None:
            return str(key)
    return None


def _check_grpo_row(obj: dict[str, Any]) -> list[str]:
    defects = []
    ids, mask, lps = obj.get("input_ids"), obj.get("loss_mask"), obj.get("logprobs")
    if not (_int_list(ids) and _int_list(mask) and isinstance(lps, list)):
        return ["input_ids, loss_mask and logprobs must be lists"]
    if not (len(ids) == len(mask) == len(lps)):
        return [f"mismatched lengths: {len(ids)} input_ids, {len(mask)} loss_mask, {len(lps)} logprobs"]
    if any(m not in (0, 1) for m in mask):
        defects.append("loss_mask holds values other than 0/1")
    bad = next((j for j, x in enumerate(lps) if not _finite_number(x)), None)
    if bad is not None:
        defects.append(f"logprobs[{bad}] is not finite")
    for key in ("reward", "advantage"):
        if not _finite_number(obj.get(key)):
            defects.append(f"'{key}' is not a finite number")
    if "group_id" not in obj:
        defects.append("missing 'group_id'")
    return defects


def _json_lines(path: Path, report: CheckReport) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    data = path.read_bytes().split(b"\n")
    for number, line in enumerate(data, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            tail = number == len(data)
            report.defects.append(
                f"line {number}: not JSON" + (" (torn last line: no newline)" if tail else "")
            )
            continue
        if not isinstance(obj, dict):
            report.defects.append(f"line {number}: not a JSON object")
            continue
        rows.append((number, obj))
    return rows


def _ledger_trajectories(root: Path, report: CheckReport) -> list[Trajectory]:
    from polar_env.trajectory.chains import build_trajectory
    from polar_env.trajectory.ledger import Ledger, LedgerError

    ledger = Ledger(root)
    trajs = []
    for info in ledger.sessions():
        try:
            calls = ledger.calls(info.session_id)
        except LedgerError as exc:
            report.defects.append(str(exc))
            continue
        trajs.append(build_trajectory(info, calls))
    return trajs

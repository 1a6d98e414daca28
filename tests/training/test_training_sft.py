"""SFT exports and the CPU training pieces of `polar train`.

The exports are token-exact: their ids are the chain's ids and their loss masks are the chain's
sampled-token masks, in the shapes TRL's SFTTrainer and NeMo-RL's SFT read. The end-to-end test
takes a real gold episode (Pi, bubblewrap, the proxy, SWE-bench grading), exports it as a user
would, and runs one SFTTrainer step on it with the embedded model.
"""

from __future__ import annotations

import json
import math

import pytest
from trajectory_helpers import call, session, three_turn

from polar_env.cli import main as polar_main
from polar_env.grades import GradeResult
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.export import TrajectoryWriter, read_trajectories
from polar_env.trajectory.sft import nemo_rl_sft_processor, sft_rows

needs_sandbox = pytest.mark.needs("bwrap", "npm")


def _graded(resolved: bool, session_id: str = "s1"):
    calls = [c.model_copy(update={"session_id": session_id}) for c in three_turn()]
    traj = build_trajectory(session(session_id), calls, reward=1.0 if resolved else 0.0)
    return traj.model_copy(update={"grading": GradeResult(instance_id="t1", resolved=resolved)})


def test_unscored_tokens_are_no_assistant_turn():
    """Tokens sampled without usable logprobs stay masked in both formats, and every chain is a row."""
    calls = three_turn()
    calls[1] = calls[1].model_copy(update={"logprobs": [float("nan"), -0.1]})
    side = call(3, [50, 51], [52, 53], reason="side call")
    traj = build_trajectory(session(), [*calls, side], reward=1.0).model_copy(
        update={"grading": GradeResult(instance_id="t1", resolved=True)}
    )
    (trl_chain, trl_side) = sft_rows([traj], "trl-sft")
    assert [r["chain"] for r in (trl_chain, trl_side)] == [0, 1]
    assert trl_chain["assistant_masks"] == traj.chains[0].loss_mask
    assert trl_chain["assistant_masks"][9:11] == [0, 0]  # the unscored span of call 1
    (nemo_chain, _) = sft_rows([traj], "nemo-rl-sft")
    roles = [(m["role"], m["polar_span"], m["token_ids"]) for m in nemo_chain["messages"]]
    assert roles == [
        ("user", "prompt", [1, 2, 3, 4]),
        ("assistant", "sampled", [10, 11, 12]),
        ("environment", "interstitial", [5, 6]),
        ("environment", "unscored", [13, 14]),
        ("environment", "interstitial", [7, 8, 9]),
        ("assistant", "sampled", [15, 16, 17, 18]),
    ]


def test_only_resolved_and_masked_episodes(tmp_path):
    masked = _graded(True, "s3").model_copy(update={"masked": True})
    path = tmp_path / "trajectories.jsonl"
    with TrajectoryWriter(path) as writer:
        for traj in (_graded(True, "s1"), _graded(False, "s2"), masked):
            writer.write(traj)
    assert polar_main(["export", str(tmp_path), "--format", "trl-sft", "--only-resolved"]) == 0
    rows = (tmp_path / "trl-sft.jsonl").read_text().splitlines()
    assert len(rows) == 1 and '"session_id":"s1"' in rows[0]
    assert polar_main(["export", str(path), "--format", "trl-sft", "--out", str(tmp_path / "all.jsonl")]) == 0
    assert len((tmp_path / "all.jsonl").read_text().splitlines()) == 2  # a masked episode never trains


def test_export_errors_are_one_line_exit_2(tmp_path, capsys):
    assert polar_main(["export", str(tmp_path / "nope.jsonl"), "--format", "trl-sft"]) == 2
    path = tmp_path / "trajectories.jsonl"
    with TrajectoryWriter(path) as writer:
        writer.write(_graded(False))
    assert polar_main(["export", str(path), "--format", "nemo-rl-sft", "--only-resolved"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "no such file" in err[0] and "no resolved episode" in err[1]


def test_nemo_rl_processor_hands_the_ids_through():
    torch = pytest.importorskip("torch")
    traj = _graded(True)
    (row,) = sft_rows([traj], "nemo-rl-sft")
    datum = nemo_rl_sft_processor({**row, "task_name": "polar"}, None, None, 4096, 7)
    flat = torch.cat([m["token_ids"] for m in datum["message_log"]]).tolist()
    trained = torch.cat(
        [torch.full_like(m["token_ids"], int(m["role"] == "assistant")) for m in datum["message_log"]]
    ).tolist()  # NeMo-RL's SFT trains the assistant role
    assert flat == traj.chains[0].input_ids and trained == traj.chains[0].loss_mask
    assert datum["length"] == len(flat) and datum["loss_multiplier"] == 1.0 and datum["idx"] == 7
    short = nemo_rl_sft_processor(row, None, None, 8, 0)
    assert short["loss_multiplier"] == 0.0  # too long: cut and not trained, as NeMo-RL's sft_processor does


def test_frozen_trunk_is_the_models_forward_and_moves_only_the_top(embedded_dir):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from polar_env.training.frozen_trunk import freeze_all_but_top, top_logprobs, trunk_hidden
    from polar_env.training.warm_start import sft_warm_start

    model = AutoModelForCausalLM.from_pretrained(str(embedded_dir), dtype=torch.float32).eval()
    ids = list(range(100, 164))
    positions = list(range(40, 64))
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float() / 0.5, dim=-1)
    recorded = [float(full[p - 1, ids[p]]) if p in positions else 0.0 for p in range(len(ids))]
    first = freeze_all_but_top(model, 2)
    got = top_logprobs(model, trunk_hidden(model, ids, first), ids, positions, first, temperature=0.5)
    assert max(abs(g - recorded[p]) for g, p in zip(got.tolist(), positions, strict=True)) < 1e-4
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses = sft_warm_start(
        model,
        [{"input_ids": ids, "assistant_masks": [int(p in positions) for p in range(len(ids))]}],
        epochs=2,
        learning_rate=1e-4,
        top_layers=2,
    )
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all(n.startswith(("model.layers.28.", "model.layers.29.")) for n in moved), sorted(moved)


@pytest.mark.slow
@needs_sandbox
def test_gold_episode_exports_trains_one_sftrainer_step_and_polar_train_runs(tmp_path, embedded_dir):
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    out = tmp_path / "gold"
    assert (
        polar_main(["rollout", "--policy", "gold", "--task-ids", "pallets__flask-5014", "--out", str(out)])
        == 0
    )
    (traj,) = read_trajectories(out / "trajectories.jsonl")
    assert traj.grading.resolved and traj.stats.calls >= 2
    assert polar_main(["export", str(out), "--format", "trl-sft", "--only-resolved"]) == 0
    assert polar_main(["export", str(out), "--format", "nemo-rl-sft", "--only-resolved"]) == 0
    dataset = load_dataset("json", data_files=str(out / "trl-sft.jsonl"), cache_dir=str(tmp_path / "hf"))[
        "train"
    ]
    assert len(dataset) == len(traj.chains)
    for row, chain in zip(dataset, traj.chains, strict=True):
        assert row["input_ids"] == chain.input_ids and row["assistant_masks"] == chain.loss_mask
        assert (
            sum(row["assistant_masks"])
            == chain.trainable_tokens
            == sum(s.end - s.start for s in chain.spans if s.kind == "sampled")
        )
    nemo = load_dataset("json", data_files=str(out / "nemo-rl-sft.jsonl"), cache_dir=str(tmp_path / "hf"))[
        "train"
    ]
    datum = nemo_rl_sft_processor(nemo[0], None, None, 1 << 16, 0)
    assert torch.cat([m["token_ids"] for m in datum["message_log"]]).tolist() == traj.chains[0].input_ids

    model = AutoModelForCausalLM.from_pretrained(str(embedded_dir), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(embedded_dir))
    args = SFTConfig(
        output_dir=str(tmp_path / "sft"),
        max_steps=1,
        per_device_train_batch_size=1,
        learning_rate=1e-5,
        save_strategy="no",
        report_to=[],
        max_length=None,
        use_cpu=True,
        logging_steps=1,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    labels = trainer.train_dataset[0]["labels"]  # what TRL made of the mask: -100 off the sampled tokens
    assert [int(label != -100) for label in labels] == traj.chains[0].loss_mask
    before = model.lm_head.weight.detach().clone()
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == 1 and math.isfinite(losses[0])
    assert not torch.equal(before, model.lm_head.weight)

    # `polar train` on the same gold episode, as small as it goes: every stage runs and writes its outputs
    run = tmp_path / "train"
    assert (
        polar_main(
            [
                "train",
                "--task-ids",
                "pallets__flask-5014",
                "--gold",
                str(out),
                "--samples",
                "2",
                "--grpo-steps",
                "1",
                "--sft-epochs",
                "1",
                "--max-tokens",
                "8",
                "--keep-checkpoints",
                "1",
                "--report-to",
                "tensorboard",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rounds = [m for m in metrics if "mean_reward" in m]
    assert [m["step"] for m in rounds] == [0, 1, 2] and all(m["episodes"] == 2 for m in rounds)
    sft = next(m for m in metrics if m["phase"] == "sft")
    assert sft["chains"] == len(traj.chains) and math.isfinite(sft["last_loss"])
    update = next(m for m in metrics if m["phase"] == "grpo update")  # PolarGRPOTrainer's step
    assert math.isfinite(update["loss"]) and update["logprob_abs_diff_max"] < 1e-4
    # 8 tokens per call: both episodes unresolved, a uniform group: no advantage, so no update
    assert (
        update["rows"] == 0 and update["frac_reward_zero_std"] == 1.0 and update["weights_max_change"] == 0.0
    )
    # `--report-to tensorboard`: every metrics.jsonl figure at its step, read by TensorBoard's own reader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert {"mean_reward", "loss", "last_loss", "accepted_work/accepted_tokens_per_hour"} <= set(
        events.Tags()["scalars"]
    )
    logged = events.Scalars("mean_reward")
    assert [e.step for e in logged] == [m["step"] for m in rounds]
    assert [e.value for e in logged] == pytest.approx([m["mean_reward"] for m in rounds])
    assert events.Scalars("loss")[0].value == pytest.approx(update["loss"])
    assert (run / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run / "checkpoints" / "sft" / "config.json").is_file()
    assert (run / "checkpoints" / "step-1" / "config.json").is_file()
    for folder in ("step-0", "grpo", "step-2"):  # every round's episodes sampled by the live model itself
        episodes = list(read_trajectories(run / "rounds" / folder / "trajectories.jsonl"))
        # "trl-live": PolarRollouts' name for the same local backend over the trainer's module
        assert len(episodes) == 2 and all(
            e.backend in ("local", "trl-live") and e.stats.sampled_tokens > 0 for e in episodes
        )

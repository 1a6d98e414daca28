"""GRPO groups in a real run's export: `polar check` fails on a dropped episode, a split group and a
group size other than the run's ``--samples``; an episode killed before its first model call is
exported as a masked placeholder that carries its task's first prompt, so it sits in its group.

One real run, shared by the tests: Pi in bubblewrap through the proxy, 3 bundled tasks x 2 samples,
the instant backend (it answers every call at once with one short final answer, so Pi ends after
one call), not graded (groups do not depend on rewards). One sample of the second task and both of
the third are started with a deadline shorter than Pi's start-up: the real runner kills the real
harness before its first call (a deadline is the one way to provoke that on demand).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar_env.cli import main as polar_main
from polar_env.trajectory.checks import first_prompt_ids, nemo_rl_groups

pytestmark = [pytest.mark.slow, pytest.mark.needs("bwrap", "npm")]

TASKS = ["marshmallow-code__marshmallow-1359", "pallets__flask-5014", "psf__requests-5414"]
KILLED = {
    "pallets__flask-5014.s1",
    "psf__requests-5414.s0",
    "psf__requests-5414.s1",
}  # before their first call
SAMPLES = 2


@pytest.fixture(scope="module")
def run_out(tmp_path_factory, embedded_dir: Path) -> Path:
    """The run's --out directory."""
    import asyncio

    from transformers import AutoTokenizer

    from polar_env.backends.embedded import EMBEDDED_MODEL_NAME
    from polar_env.backends.instant import InstantBackend
    from polar_env.episodes import stages
    from polar_env.rollout.config import RolloutConfig
    from polar_env.rollout.outputs import finish_outputs
    from polar_env.rollout.plan import plan_from_config
    from polar_env.rollout.runner import proxy_factory, run_rollouts
    from polar_env.tasks.loader import load_tasks

    out = tmp_path_factory.mktemp("groups") / "out"
    tokenizer = AutoTokenizer.from_pretrained(embedded_dir)
    backend = InstantBackend(
        tokenizer.encode("Done.", add_special_tokens=False) + [tokenizer.eos_token_id],
        model=EMBEDDED_MODEL_NAME,
    )
    config = RolloutConfig(
        harness="pi",
        task_ids=TASKS,
        samples=SAMPLES,
        concurrency=2,
        timeout=240,
        max_context=131072,
        out=out,
        model_dir=embedded_dir,
    )
    plan = plan_from_config(config)
    plan.grade = False
    real_run_harness = stages.run_harness

    async def run_harness(session, sandbox, prompt, *, timeout_s):
        if session.session_id.rsplit(".", 1)[0] in KILLED:
            timeout_s = 0.2  # Pi's node start-up alone takes longer: killed before any model call
        return await real_run_harness(session, sandbox, prompt, timeout_s=timeout_s)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stages, "run_harness", run_harness)
        trajectories = asyncio.run(
            run_rollouts(plan, proxy_factory(config, backend=backend, tasks=load_tasks("bundled")))
        )
    finish_outputs(out, trajectories)
    return out


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "nemo_results.jsonl").read_text().splitlines()]


def key(row: dict) -> str:
    return row["polar"]["session_id"].rsplit(".", 1)[0]


def test_placeholder_carries_its_tasks_first_prompt_and_sits_in_its_group(run_out: Path, capsys):
    results = rows(run_out)
    assert sorted(map(key, results)) == sorted(f"{t}.s{k}" for t in TASKS for k in range(SAMPLES))
    by_key = {key(r): r for r in results}
    for k in KILLED:
        r = by_key[k]
        assert r["polar"]["status"] != "completed" and r["num_calls"] == 0, r["polar"]
        assert r["instance_config"]["mask_sample"] is True
    placeholder, sibling = by_key["pallets__flask-5014.s1"], by_key["pallets__flask-5014.s0"]
    assert sibling["num_calls"] >= 1 and sibling["polar"]["first_prompt"] == "own"
    assert placeholder["polar"]["first_prompt"] == "sibling"
    assert len(first_prompt_ids(sibling)) > 1000  # Pi's real system prompt, not a stub
    assert first_prompt_ids(placeholder) == first_prompt_ids(sibling)
    # NeMo-RL's grouping: the reached tasks are 2 groups of 2; the task none reached is one unusable group
    groups = sorted(
        sorted(key(results[i]) for i in g) for g in nemo_rl_groups([first_prompt_ids(r) for r in results])
    )
    assert groups == [[f"{t}.s0", f"{t}.s1"] for t in TASKS], groups
    assert by_key["psf__requests-5414.s0"]["polar"]["first_prompt"] == "none"
    summary = json.loads((run_out / "summary.json").read_text())
    assert summary["unusable_groups"] == ["psf__requests-5414"]

    assert polar_main(["check", str(run_out / "nemo_results.jsonl"), "--samples", str(SAMPLES)]) == 0
    out = capsys.readouterr().out
    assert (
        "OK" in out
        and "1 group(s) unusable, no rollout reached the model" in out
        and "psf__requests-5414" in out
    ), out
    assert polar_main(["check", str(run_out / "trajectories.jsonl"), "--samples", str(SAMPLES)]) == 0, (
        capsys.readouterr().out
    )


def test_check_fails_on_a_dropped_episode_and_on_a_size_other_than_samples(
    run_out: Path, tmp_path: Path, capsys
):
    results = rows(run_out)
    dropped = tmp_path / "dropped.jsonl"
    dropped.write_text(
        "".join(json.dumps(r) + "\n" for r in results if key(r) != "marshmallow-code__marshmallow-1359.s1")
    )
    assert polar_main(["check", str(dropped)]) == 1
    out = capsys.readouterr().out
    assert (
        "DEFECT: task marshmallow-code__marshmallow-1359: 1 rollout(s) where the run's other tasks have 2"
        in out
    ), out
    assert polar_main(["check", str(dropped), "--samples", "2"]) == 1
    assert (
        "task marshmallow-code__marshmallow-1359: 1 rollout(s) but the run's --samples is 2"
        in capsys.readouterr().out
    )
    assert polar_main(["check", str(run_out / "nemo_results.jsonl"), "--samples", "3"]) == 1
    out = capsys.readouterr().out
    assert all(f"task {t}: 2 rollout(s) but the run's --samples is 3" in out for t in TASKS), out

    trajs = (run_out / "trajectories.jsonl").read_text().splitlines(keepends=True)
    lines = tmp_path / "dropped.trajectories.jsonl"
    lines.write_text("".join(t for t in trajs if '"pallets__flask-5014.s0.a0"' not in t))
    assert polar_main(["check", str(lines)]) == 1
    assert "task pallets__flask-5014: 1 rollout(s)" in capsys.readouterr().out


def test_check_fails_on_a_split_group_naming_the_task_and_the_text(run_out: Path, tmp_path: Path, capsys):
    results = rows(run_out)
    victim = next(r for r in results if key(r) == "marshmallow-code__marshmallow-1359.s1")
    ids = list(first_prompt_ids(victim))
    pos = len(ids) // 2
    # another first prompt, as a harness that listed two skills the other way round would send: one token
    # changed in every trainable item, so the result itself stays contiguous and valid
    for item in victim["response"]["output"]:
        if item.get("prompt_token_ids"):
            item["prompt_token_ids"][pos] = ids[pos] + 1
    split = tmp_path / "split.jsonl"
    split.write_text("".join(json.dumps(r) + "\n" for r in results))
    assert polar_main(["check", str(split), "--samples", "2"]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "DEFECT: task marshmallow-code__marshmallow-1359:" in x)
    assert f"in its first prompt at token {pos} (" in line, (
        out
    )  # which of the two is "rollout 0": the file's order
    assert f"({ids[pos]} vs {ids[pos] + 1};" in line or f"({ids[pos] + 1} vs {ids[pos]};" in line, line
    assert "⟦" in line and "NeMo-RL would split the task's group" in line, line  # the text around it, decoded
    assert not any("line " in x and "DEFECT" in x for x in out.splitlines()), (
        out
    )  # each result is still valid

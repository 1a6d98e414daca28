"""`polar check PATH`: readable report, exit 1 on defects, works on every file kind and a ledger dir."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from trajectory_helpers import call, session, three_turn

from polar_env.cli import main as polar_main
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.export import TrajectoryWriter, to_nemo_gym_result, write_jsonl
from polar_env.trajectory.ledger import Ledger


def test_check_cli_reports_ok_and_defects(tmp_path: Path, capsys):
    good = tmp_path / "results.jsonl"
    results = [
        to_nemo_gym_result(
            build_trajectory(session(f"s{i}"), three_turn()),
            reward=float(i),
            responses_create_params={"input": []},
        ).row()
        for i in range(2)
    ]
    write_jsonl(good, results)
    assert polar_main(["check", str(good)]) == 0
    out = capsys.readouterr().out
    assert "nemo file, 2 item(s)" in out and "OK" in out

    results[1]["response"]["output"][0]["prompt_token_ids"][0] = 77  # a different first prompt
    results[0]["response"]["output"][2]["generation_log_probs"][0] = None
    bad = tmp_path / "bad.jsonl"
    write_jsonl(bad, results)
    assert polar_main(["check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "line 1: response.output[2]: generation_log_probs[0] is not finite" in out
    assert "task g1: rollout 1 differs from rollout 0 in its first prompt at token 0 (1 vs 77" in out

    torn = tmp_path / "torn.jsonl"
    with TrajectoryWriter(torn) as writer:
        writer.write(build_trajectory(session(), three_turn(), reward=1.0))
    with open(torn, "ab") as handle:
        handle.write(b'{"schema_version": 1, "chai')
    assert polar_main(["check", str(torn)]) == 1
    assert "torn last line" in capsys.readouterr().out

    assert polar_main(["check", str(tmp_path / "missing.jsonl")]) == 2

    run = tmp_path / "run"  # a run's output folder (`polar rollout --out`) is checked by its trajectories
    run.mkdir()
    with TrajectoryWriter(run / "trajectories.jsonl") as writer:
        writer.write(build_trajectory(session(), three_turn(), reward=1.0))
    assert polar_main(["check", str(run)]) == 0
    assert f"{run / 'trajectories.jsonl'}: polar file, 1 item(s)" in capsys.readouterr().out
    shutil.copy(torn, run / "trajectories.jsonl")
    assert polar_main(["check", str(run)]) == 1


def test_check_cli_on_a_ledger_directory(tmp_path: Path, capsys):
    ledger = Ledger(tmp_path / "proxy")
    ledger.create_session(session("s1"))
    for record in three_turn() + [call(3, [50, 51], [52], reason="side call")]:
        ledger.append(record)
    assert polar_main(["check", str(tmp_path / "proxy")]) == 0
    out = capsys.readouterr().out
    assert "ledger directory, 1 item(s)" in out and "side call x1" in out

    unknown = tmp_path / "x.jsonl"
    unknown.write_text(json.dumps({"hello": 1}) + "\n")
    assert polar_main(["check", str(unknown)]) == 1


def test_check_warns_with_the_fraction_nemo_rl_will_not_train(tmp_path: Path, capsys):
    """NeMo-RL trains each episode's main chain only: tokens sampled in a side chain are in Polar's
    file but lost to a NeMo-RL run, which `polar check` says (a warning: the files are valid)."""
    side = build_trajectory(
        session("s1"), three_turn() + [call(3, [50, 51], [52], reason="side call")], reward=1.0
    )
    clean = build_trajectory(session("s2"), three_turn(), reward=1.0)
    for name, trajs in (("side", [side, clean]), ("clean", [clean])):
        with TrajectoryWriter(tmp_path / f"{name}.jsonl") as writer:
            for t in trajs:
                writer.write(t)
        write_jsonl(
            tmp_path / f"{name}.nemo.jsonl",
            [to_nemo_gym_result(t, responses_create_params={"input": []}).row() for t in trajs],
        )
    assert polar_main(["check", str(tmp_path / "side.jsonl")]) == 0
    assert (
        "WARNING: 1 of 19 sampled tokens (5.3%) sit in chains NeMo-RL will not train"
        in capsys.readouterr().out
    )
    assert polar_main(["check", str(tmp_path / "side.nemo.jsonl")]) == 0
    assert (
        "WARNING: 1 of 19 trainable tokens (5.3%) sit in chains NeMo-RL will not train"
        in capsys.readouterr().out
    )
    for name in ("clean.jsonl", "clean.nemo.jsonl"):
        assert polar_main(["check", str(tmp_path / name)]) == 0
        assert "WARNING" not in capsys.readouterr().out

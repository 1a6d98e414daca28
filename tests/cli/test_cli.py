"""`polar`: one argparse tree; every command answers --help, and only the chosen one is imported."""

from __future__ import annotations

import subprocess
import sys

from polar_env.cli import COMMANDS


def polar(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "polar_env.cli", *argv], capture_output=True, text=True, timeout=120
    )


def test_help_lists_every_command_and_a_bad_one_exits_2():
    top = polar("--help")
    assert top.returncode == 0
    text = " ".join(top.stdout.split())  # argparse wraps the help lines
    for command in COMMANDS:
        assert f"{command.name} {command.help}" in text
    bad = polar("nonsense")
    assert bad.returncode == 2 and "invalid choice: 'nonsense'" in bad.stderr
    assert polar().returncode == 2


def test_nested_and_shared_flags_reach_their_commands():
    serve = polar("proxy", "serve", "--help")
    assert serve.returncode == 0 and "--admin-secret" in serve.stdout and "/admin/sessions" in serve.stdout
    rollout, demo = polar("rollout", "--help"), polar("demo", "--help")
    assert "--ray" in rollout.stdout and "--ray" not in demo.stdout
    for flag in ("--score-window", "--task-ids", "--grading-timeout"):
        assert flag in rollout.stdout and flag in demo.stdout
    assert "--quick" in demo.stdout


def test_only_the_chosen_command_is_imported():
    modules = sorted({c.module for top in COMMANDS for c in (top, *top.children) if c.module})
    code = (
        "import sys; from polar_env.cli import build_parser; "
        "build_parser(['check']).parse_args(['check', 'x']); "
        f"print([m for m in {modules!r} if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "['polar_env.cli.check']"


def test_train_with_unknown_task_ids_says_so_in_one_line(tmp_path):
    """Comma-separated ids (the form `--task-ids` does not take) name no bundled task."""
    run = polar(
        "train",
        "--task-ids",
        "pallets__flask-5014,psf__requests-5414",
        "--samples",
        "2",
        "--out",
        str(tmp_path / "train"),
    )
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("polar train: ") and "Traceback" not in run.stderr

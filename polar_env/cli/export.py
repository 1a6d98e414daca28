"""``polar export PATH --format trl-sft|nemo-rl-sft [--only-resolved] [--train-paths P]``: trajectories as an
SFT dataset.

The rows are JSONL, token-exact (docs/learning.md): TRL loads them with
``datasets.load_dataset("json", data_files=FILE)`` and ``SFTTrainer`` trains on them as they are;
NeMo-RL reads them with its ``openai_format`` dataset and Polar's processor.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from polar_env.trajectory.sft import SFT_FORMATS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "path", type=Path, help="a Polar trajectory file, or a run directory holding trajectories.jsonl"
    )
    parser.add_argument("--format", required=True, choices=SFT_FORMATS, dest="fmt")
    parser.add_argument(
        "--only-resolved",
        action="store_true",
        help="keep only episodes the SWE-bench grader resolved (rejection-sampling fine-tuning)",
    )
    parser.add_argument(
        "--train-paths",
        default="all",
        metavar="all|main|final|MODULE:FUNCTION",
        help="which chains of an episode become rows (default all: docs/training.md)",
    )
    parser.add_argument(
        "--out", type=Path, help="output JSONL (default: FORMAT.jsonl beside the trajectories)"
    )


def run(args: argparse.Namespace) -> int:
    from polar_env.trajectory.export import read_trajectories, trajectory_file, write_jsonl
    from polar_env.trajectory.sft import sft_rows

    source = trajectory_file(args.path)
    if not source.is_file():
        print(f"polar export: {source}: no such file", file=sys.stderr)
        return 2
    try:
        trajectories = list(read_trajectories(source))
    except ValueError as exc:
        print(f"polar export: {exc}", file=sys.stderr)
        return 2
    try:
        rows = sft_rows(
            trajectories, args.fmt, only_resolved=args.only_resolved, train_paths=args.train_paths
        )
    except ValueError as exc:
        print(f"polar export: {exc}", file=sys.stderr)
        return 2
    if not rows:
        kept = "resolved " if args.only_resolved else ""
        print(
            f"polar export: no {kept}episode with a trainable token in {source} "
            f"({len(trajectories)} episodes)",
            file=sys.stderr,
        )
        return 2
    out = args.out or source.parent / f"{args.fmt}.jsonl"
    write_jsonl(out, rows)
    episodes = len({r["session_id"] for r in rows})
    tokens = sum(
        sum(r["assistant_masks"])
        if "assistant_masks" in r
        else sum(len(m["token_ids"]) for m in r["messages"] if m["role"] == "assistant")
        for r in rows
    )
    print(
        f"wrote {len(rows)} chains of {episodes} of {len(trajectories)} episodes ({tokens} trained tokens) "
        f"to {out}"
    )
    return 0

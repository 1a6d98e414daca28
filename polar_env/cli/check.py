"""``polar check PATH [--rescore MODEL_DIR]``: run the contract, group and fidelity checks on a file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from polar_env.trajectory.checks import check_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check a Polar trajectory file, a NeMo Gym results file, a GRPO batch or a ledger directory: "
        "NeMo-RL contract, one first prompt and one group size per task (as NeMo-RL groups), and (with "
        "--rescore) recorded logprobs against one forward pass of the model."
    )
    parser.add_argument("path", type=Path)
    parser.add_argument(
        "--rescore",
        metavar="MODEL_DIR",
        type=Path,
        help="re-score trainable tokens with this local model (float32)",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="DIR",
        type=Path,
        help="decode text around differing first prompts (default: the --rescore model)",
    )
    parser.add_argument(
        "--samples",
        type=int,
        metavar="N",
        help="the run's rollouts per task: every task must have exactly N (default: as many "
        "as the run's other tasks)",
    )
    parser.add_argument(
        "--max-diff",
        type=float,
        default=1e-3,
        help="re-score max |diff| above this is a defect (default 1e-3)",
    )
    parser.add_argument("--device", default="cpu", help="where --rescore runs the model (cpu, cuda)")


def run(args: argparse.Namespace) -> int:
    if not args.path.exists():
        print(f"polar check: {args.path}: no such file or directory", file=sys.stderr)
        return 2
    scorer = tokenizer = None
    if args.rescore:
        from polar_env.backends.local import LocalBackend

        scorer = LocalBackend.from_pretrained(
            args.rescore, device=args.device
        )  # float32, the code that samples locally
        tokenizer = scorer.tokenizer
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    report = check_path(args.path, tokenizer=tokenizer, scorer=scorer, samples=args.samples)
    if report.rescore is not None and report.rescore["max_abs_diff"] > args.max_diff:
        report.defects.append(
            f"re-scored logprobs differ from the recorded ones by up to "
            f"{report.rescore['max_abs_diff']:.3g} (limit {args.max_diff:g})"
        )
    print(report.render())
    return 0 if report.ok else 1

"""`polar eval`: grade a SWE-bench predictions file against a task set, in parallel.

Predictions use SWE-bench's format (`instance_id`, `model_patch`, `model_name_or_path`), as
JSONL or a JSON list. The report mirrors SWE-bench's harness summary (counts and id lists)
plus the per-prediction `GradeResult` (both modes, flags). Several predictions for one instance
are allowed when their `model_name_or_path` differ (a red-team corpus, several models); they are
then keyed ``<instance_id>@<model_name_or_path>``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from tqdm import tqdm

from polar_env.episodes.workspace import SANDBOX_CHOICES, check_engine, workspace_kinds
from polar_env.grades import GradeResult, GradingMode
from polar_env.outcomes import FailureKind
from polar_env.rewards import swebench_compat as sb
from polar_env.rewards.grader import grade_task
from polar_env.rewards.sandbox_exec import grading_timeout_s
from polar_env.tasks.env import EnvBuildError, ensure_task_env
from polar_env.tasks.loader import TaskLoadError, load_tasks
from polar_env.tasks.models import Task
from polar_env.tasks.runtime import WorkspaceUnavailable, check_image


def load_predictions(path: Path) -> list[dict]:
    text = path.read_text()
    if path.suffix == ".json":
        rows = json.loads(text)
        return list(rows.values()) if isinstance(rows, dict) else rows
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def prediction_keys(preds: list[dict]) -> list[str]:
    """The report key of each prediction: its instance id, or ``id@model`` when an id repeats."""
    counts = Counter(p["instance_id"] for p in preds)
    return [
        p["instance_id"]
        if counts[p["instance_id"]] == 1
        else f"{p['instance_id']}@{p.get('model_name_or_path', '')}"
        for p in preds
    ]


def build_report(
    results: dict[str, GradeResult],
    tasks: dict[str, Task],
    preds: list[dict],
    seconds: float,
    mode: GradingMode = GradingMode.strict,
) -> dict:
    by_kind = {k.value: sorted(key for key, r in results.items() if r.failure_kind == k) for k in FailureKind}
    resolved = sorted(key for key, r in results.items() if r.resolved)
    graded = {key: r for key, r in results.items() if not r.failure_kind.outside_policy}
    flags = Counter(f for r in results.values() for f in r.flags)
    return {
        "total_instances": len(tasks),
        "submitted_instances": len(preds),
        "completed_instances": len(graded),
        "resolved_instances": len(resolved),
        "unresolved_instances": len(graded) - len(resolved),
        "empty_patch_instances": len(by_kind["empty_patch"]),
        "error_instances": len(results) - len(graded),
        "resolved_rate": len(resolved) / len(results) if results else 0.0,
        "resolved_ids": resolved,
        "unresolved_ids": sorted(key for key, r in graded.items() if not r.resolved),
        "failure_kinds": by_kind,
        "mode": mode.value,
        "resolved_by_mode": {
            m.value: sum(r.modes.get(m) is not None and r.modes[m].resolved for r in results.values())
            for m in GradingMode
        },
        "disagreements": {key: r.disagreement for key, r in sorted(results.items()) if r.disagreement},
        "flags": dict(sorted(flags.items())),
        "seconds": round(seconds, 2),
        "seconds_per_instance": round(
            sum(r.timings.get("total_s", 0.0) for r in results.values()) / max(len(results), 1), 2
        ),
        "model_name_or_path": sorted({p.get("model_name_or_path", "") for p in preds}),
        "instances": {key: r.model_dump(mode="json") for key, r in sorted(results.items())},
    }


def summary_text(report: dict) -> str:
    n = report["submitted_instances"]
    lines = [
        f"Instances submitted: {n}  completed: {report['completed_instances']}  "
        f"errors (infrastructure): {report['error_instances']}",
        f"Resolved: {report['resolved_instances']}/{n} ({100 * report['resolved_rate']:.1f}%)  "
        f"empty patches: {report['empty_patch_instances']}  "
        f"time: {report['seconds']}s ({report['seconds_per_instance']}s per grading)",
        f"Mode: {report['mode']}  resolved by mode: "
        + ", ".join(f"{m} {n}" for m, n in report["resolved_by_mode"].items())
        + f"  disagreements: {len(report['disagreements'])}",
    ]
    if report["flags"]:
        lines.append("Tampering flags: " + ", ".join(f"{f} {n}" for f, n in report["flags"].items()))
    for iid, r in sorted(report["instances"].items()):
        outcome = "RESOLVED" if r["resolved"] else f"unresolved ({r['failure_kind']})"
        if r["failure_kind"] == FailureKind.none.value:
            f2p = sum(s in ("PASSED", "XFAIL") for s in r["fail_to_pass"].values())
            p2p_broken = sum(s not in ("PASSED", "XFAIL", "SKIPPED") for s in r["pass_to_pass"].values())
            outcome += f"  [F2P passed {f2p}/{len(r['fail_to_pass'])}, P2P broken {p2p_broken}]"
        elif r["error"]:
            outcome += f"  [{r['error'].splitlines()[0]}]"
        if r["flags"]:
            outcome += f"  flags: {', '.join(r['flags'])}"
        lines.append(f"  {iid}: {outcome}")
    return "\n".join(lines)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.description = "Grade SWE-bench predictions."
    ap.add_argument(
        "--tasks",
        default="bundled",
        help="bundled | terminal | verified | path/to/tasks.jsonl | a Harbor task folder",
    )
    ap.add_argument("--predictions", required=True, type=Path, help="predictions .jsonl or .json")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    ap.add_argument(
        "--grading-timeout",
        "--timeout",  # its old name, kept as an alias: `--timeout` is the harness's deadline elsewhere
        type=float,
        default=grading_timeout_s(),
        help="grading deadline (s; default: POLAR_GRADING_TIMEOUT_S or the built-in one; --timeout is "
        "its old name)",
    )
    ap.add_argument("--instance-ids", nargs="*", default=None, help="grade only these instances")
    ap.add_argument(
        "--sandbox",
        default="auto",
        choices=SANDBOX_CHOICES,
        help="where to grade: auto (bubblewrap for tasks with a base archive, the task's image "
        "otherwise) or one engine for every task (podman/docker: in the task's image)",
    )
    ap.add_argument(
        "--mode",
        choices=[m.value for m in GradingMode],
        default=GradingMode.strict.value,
        help="whose verdict is the reward: strict (default) or swebench; both are reported",
    )


def run(args: argparse.Namespace) -> int:
    try:
        tasks = {t.instance_id: t for t in load_tasks(args.tasks)}
        if not args.predictions.is_file():
            raise TaskLoadError(
                f"predictions file {args.predictions} does not exist: pass a SWE-bench "
                "predictions .jsonl/.json (instance_id, model_patch, model_name_or_path)"
            )
        preds = load_predictions(args.predictions)
    except (TaskLoadError, ValueError) as e:
        print(f"polar eval: {e}".splitlines()[0], file=sys.stderr)
        return 2
    if args.instance_ids:
        preds = [p for p in preds if p["instance_id"] in set(args.instance_ids)]
    unknown = sorted(p["instance_id"] for p in preds if p["instance_id"] not in tasks)
    if unknown:
        print(f"polar eval: predictions for unknown instances: {', '.join(unknown)}", file=sys.stderr)
        return 2
    keys = prediction_keys(preds)
    if len(set(keys)) != len(keys):
        dup = sorted(k for k, n in Counter(keys).items() if n > 1)
        print(f"polar eval: repeated instance_id and model_name_or_path: {', '.join(dup)}", file=sys.stderr)
        return 2

    try:  # where each task is graded; refuse early when its engine or image is not here
        kinds = workspace_kinds((tasks[iid] for iid in {p["instance_id"] for p in preds}), args.sandbox)
        for iid, kind in kinds.items():
            check_engine(kind)
            check_image(tasks[iid], kind)
    except WorkspaceUnavailable as e:
        print(f"polar eval: {e}", file=sys.stderr)
        return 2
    # Build the pinned environments first, once each (setup needs PyPI; grading never does).
    for iid in sorted(i for i, kind in kinds.items() if kind == "bubblewrap"):
        try:
            ensure_task_env(tasks[iid])
        except EnvBuildError as e:
            print(
                f"polar eval: environment for {iid} failed (graded as infrastructure): {e}", file=sys.stderr
            )

    sb.preload()
    t0 = time.monotonic()
    results: dict[str, GradeResult] = {}
    mode = GradingMode(args.mode)
    with ThreadPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = {
            pool.submit(
                grade_task,
                tasks[p["instance_id"]],
                p.get("model_patch"),
                kind=kinds[p["instance_id"]],
                timeout_s=args.grading_timeout,
                mode=mode,
            ): key
            for key, p in zip(keys, preds, strict=True)
        }
        for fut in tqdm(as_completed(futures), total=len(futures), desc="grading", unit="inst"):
            results[futures[fut]] = fut.result()
    report = build_report(results, tasks, preds, time.monotonic() - t0, mode)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(summary_text(report))
    if args.out:
        print(f"Report written to {args.out}")
    return 0

"""Write NeMo Gym data rows for Polar's tasks: the prompt plus the task id, one row per task.

The shape is what ``gym dataset collate`` writes (``task_source`` names the agent instance that
serves the row); ``gym dataset collate +mode=example_validation`` then writes example_metrics.json.

    python resources_servers/polar/create_examples.py                  # data/example.jsonl (bundled)
    python resources_servers/polar/create_examples.py --tasks verified --agent polar_codex_agent \\
        --out train.jsonl                                              # SWE-bench Verified rows
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from polar_env.episodes import episode_prompt  # noqa: E402
from polar_env.tasks.loader import load_tasks  # noqa: E402


def rows(tasks: str = "bundled", agent: str = "polar_pi_agent") -> list[dict]:
    return [
        {
            "responses_create_params": {"input": [{"role": "user", "content": episode_prompt(task)}]},
            "task_id": task.instance_id,
            "task_source": agent,
        }
        for task in load_tasks(tasks)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="bundled", help="bundled | verified | a tasks JSONL path")
    parser.add_argument("--agent", default="polar_pi_agent", help="agent instance that serves the rows")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "data" / "example.jsonl")
    args = parser.parse_args(argv)
    out = rows(args.tasks, args.agent)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in out))
    print(f"wrote {len(out)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The rollout progress bar."""

from __future__ import annotations

import time
from collections import Counter

from tqdm import tqdm

from polar_env.trajectory.models import Trajectory


class Progress:
    """The progress bar: done, episodes in each stage (prepare, wait for a run slot, run, finish)
    or running (``running``, where the stages happen elsewhere: Ray nodes), failed, resolved so
    far, sampled tokens/s."""

    def __init__(self, total: int, done: int):
        self.bar = tqdm(total=total, initial=done, desc="rollouts", unit="ep", dynamic_ncols=True)
        self.running = self.failed = self.resolved = self.tokens = 0
        self.stages: Counter[str] | None = None  # the runner's live counts, when it runs here
        self.started = time.monotonic()

    def update(self, trajectory: Trajectory | None = None) -> None:
        """Refresh the bar; with a finished episode's trajectory, count it first."""
        if trajectory is not None:
            self.failed += trajectory.status != "completed"
            self.resolved += bool(trajectory.grading and trajectory.grading.resolved)
            self.tokens += trajectory.stats.sampled_tokens
            self.bar.update(1)
        rate = self.tokens / max(time.monotonic() - self.started, 1e-9)
        where = (
            {k: self.stages[k] for k in ("prepare", "wait", "run", "finish")}
            if self.stages is not None
            else {"running": self.running}
        )
        self.bar.set_postfix(
            {**where, "failed": self.failed, "resolved": self.resolved, "tok_s": f"{rate:.1f}"}
        )

    def close(self) -> None:
        self.bar.close()

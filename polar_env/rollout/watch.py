"""Watching a job while it runs (docs/rollout.md, "Watching a run"): ``--metrics-port`` serves the
process's Prometheus metrics (polar_env/metrics.py) at ``/metrics``, and ``--report-to`` logs its
per-round figures to TensorBoard and/or Weights & Biases, under the keys summary.json and
metrics.jsonl use (nested keys joined by ``/``: ``accepted_work/accepted_tokens_per_hour``).

Both are optional dependencies (``pip install 'polar-env[tensorboard]'`` or ``[wandb]``), off
unless asked for; a missing one is said before the job starts (``WatchUnavailable``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from polar_env.metrics import MetricsServer
from polar_env.rollout.config import RolloutConfig


class WatchUnavailable(Exception):
    """A ``--report-to`` target whose package is not installed, or a bad ``--metrics-port``."""


class Reporter(Protocol):
    def log(self, figures: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def flatten(figures: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers in ``figures`` (nested mappings joined by ``/``); text, lists, None and bools left out."""
    out: dict[str, float] = {}
    for key, value in figures.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}/"))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value)
    return out


class TensorBoardReporter:
    """Scalars in an event file under ``logdir``, as TensorBoard's own writer writes them."""

    def __init__(self, logdir: Path):
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError:
            raise WatchUnavailable(
                "--report-to tensorboard needs the tensorboard package: pip install 'polar-env[tensorboard]'"
            ) from None
        # protobuf's generated classes, which type checkers do not see
        self._event, self._summary = event_pb2.Event, summary_pb2.Summary  # pyright: ignore[reportAttributeAccessIssue]
        self.logdir = logdir
        self._writer = EventFileWriter(str(logdir))

    def log(self, figures: Mapping[str, float], step: int) -> None:
        values = [self._summary.Value(tag=tag, simple_value=value) for tag, value in figures.items()]
        self._writer.add_event(
            self._event(wall_time=time.time(), step=step, summary=self._summary(value=values))
        )
        self._writer.flush()  # a run can be killed any time: what is logged is on disk

    def close(self) -> None:
        self._writer.close()


class WandbReporter:
    """A Weights & Biases run (its project, entity and mode from the usual ``WANDB_*`` variables;
    ``WANDB_MODE=offline`` keeps it on disk under ``dir``)."""

    def __init__(self, directory: Path, name: str, config: dict[str, Any]):
        try:
            import wandb  # pyright: ignore[reportMissingImports]  # optional: the `wandb` extra
        except ImportError:
            raise WatchUnavailable(
                "--report-to wandb needs the wandb package: pip install 'polar-env[wandb]'"
            ) from None
        directory.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "polar"), name=name, dir=str(directory), config=config
        )

    def log(self, figures: Mapping[str, float], step: int) -> None:
        self._run.log(dict(figures), step=step)

    def close(self) -> None:
        self._run.finish()


class Watch:
    """A job's metrics server and reporters, opened before it starts and closed when it ends."""

    def __init__(self, config: RolloutConfig, out: Path, command: str):
        self.server: MetricsServer | None = None
        self.reporters: list[Reporter] = []
        try:
            if config.metrics_port is not None:
                try:
                    self.server = MetricsServer(config.metrics_port)
                except (ValueError, OSError) as exc:
                    raise WatchUnavailable(f"--metrics-port {config.metrics_port}: {exc}") from None
                print(f"{command}: metrics at {self.server.url}", file=sys.stderr, flush=True)
            for target in dict.fromkeys(config.report_to):
                if target == "tensorboard":
                    self.reporters.append(TensorBoardReporter(out / "tensorboard"))
                else:
                    self.reporters.append(
                        WandbReporter(out, f"{command} {out.name}", config.model_dump(mode="json"))
                    )
        except BaseException:
            self.close()
            raise

    def report(self, figures: Mapping[str, Any], step: int) -> None:
        """Log ``figures``' numbers at ``step`` to every reporter."""
        flat = flatten(figures)
        for reporter in self.reporters:
            reporter.log(flat, step)

    def close(self) -> None:
        for reporter in self.reporters:
            reporter.close()
        self.reporters = []
        if self.server is not None:
            self.server.close()
            self.server = None

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

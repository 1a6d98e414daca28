"""What went wrong in one episode of the Gym agent, as structured fields next to its failure kind.

``polar_env.outcomes`` classifies an episode into one ``FailureKind`` and its table decides the
reward and the mask. This record says the rest of what happened, for people and dashboards: what
died or failed (``component``), in which stage (NeMo Gym's ``FailureStage`` names), when (seconds
after the episode started), with which exit code or signal, during which model call (the one in
flight when a harness died, the last failed one for a policy server failure), and one sentence.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from polar_env.outcomes import FailureKind

Stage = Literal[
    "admission", "seed", "agent", "verification", "cleanup"
]  # nemo_gym.failure_kinds.FailureStage
Component = Literal[
    "request",
    "resources_server",
    "sandbox",
    "harness",
    "policy",
    "policy_server",
    "proxy",
    "grader",
    "client",
    "agent_server",
]

# what failed, for kinds classified from the ledger and the grade (the others are recorded where they happen)
COMPONENT: dict[FailureKind, Component] = {
    FailureKind.backend_failure: "policy_server",
    FailureKind.deadline_backend: "policy_server",
    FailureKind.proxy_failure: "proxy",
    FailureKind.harness_crashed: "harness",
    FailureKind.harness_start_failed: "harness",
    FailureKind.harness_killed: "harness",
    FailureKind.deadline_harness: "harness",
    FailureKind.infrastructure: "grader",
    FailureKind.task_defect: "grader",
    FailureKind.lost_session: "resources_server",
    FailureKind.sandbox_failure: "sandbox",
    FailureKind.input_error: "request",
}


class EpisodeFailure(BaseModel):
    kind: FailureKind
    stage: Stage
    component: Component
    cause: str
    at_s: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    in_flight_call: int | None = None

"""The Polar resources server's NeMo Gym endpoints: the bodies of ``/seed_session``, ``/verify`` and
``/close_session``, declared once for both sides (the resources server validates requests and answers
with them; the agent server sends them and parses the answers, so a malformed answer fails validation
by name rather than as a ``KeyError``), and the workspace shapes a seed hands the agent.

Free of NeMo Gym, so polar_env imports without it: the Gym apps (``nemo_gym_env/``) bind each body to
Gym's base model of its endpoint (``BaseSeedSessionRequest``, ``BaseVerifyRequest``, ...), which types
the echoed ``responses_create_params`` and ``response`` and checks ``failure_kind``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

# where a task's workspace lives: a bubblewrap tree, a container of the task's image, an apptainer sandbox
WorkspaceKind = Literal["bubblewrap", "docker", "podman", "apptainer"]


class WorkspaceMounts(BaseModel):
    """What the process running the harness needs mounted (absent for grading-only workspaces)."""

    proxy_socket_dir: str | None = None
    harness_dir: str | None = None


class WorkspaceRef(BaseModel):
    """How another process on this host attaches to a workspace."""

    kind: WorkspaceKind = "bubblewrap"
    root: str = ""  # bubblewrap/apptainer: the host dir holding testbed/
    container: str = ""  # docker/podman: the container name
    image: str = ""
    path: str = ""  # docker/podman: the image's PATH
    workdir: str = "/testbed"  # where the task tree is inside (a Harbor task's or dataset's own)
    clone: str = ""  # bubblewrap: how the task tree was copied from its warm base ("reflink" or "copy")
    uid: int
    gid: int
    # docker/podman: the host uid of a container's root where it runs in a user namespace of its own (a
    # Harbor task's: its agent may be root there), and the agent's HOME in it; the attaching side needs both
    userns_base: int | None = None
    home: str = ""


class SeedSessionRequest(BaseModel):
    """Open the task's workspace for the episode (idempotent per ``episode_id``)."""

    model_config = ConfigDict(extra="forbid")

    episode_id: str
    task_id: str
    mounts: WorkspaceMounts | None = None  # the agent's proxy socket dir and harness install (containers)


class SeedSessionResponse(BaseModel):
    """The workspace to attach to and the task's identity."""

    episode_id: str
    task_id: str
    sandbox_root: str  # the bubblewrap/apptainer workspace dir ("" for a container)
    uid: int
    gid: int
    workspace: WorkspaceRef | None = None  # how to attach (absent from older servers: a bubblewrap root)

    def ref(self) -> WorkspaceRef:
        return self.workspace or WorkspaceRef(
            kind="bubblewrap", root=self.sandbox_root, uid=self.uid, gid=self.gid
        )


class CloseSessionRequest(BaseModel):
    """Close by Polar's episode id (the agent's flow; Gym's typed close also needs an EpisodeId)."""

    model_config = ConfigDict(extra="forbid")

    resources_session_id: str


class CloseSessionResponse(BaseModel):
    resources_session_id: str


class VerifyRequest(BaseModel):
    """Either ``episode_id`` (grade the seeded workspace) or ``task_id`` + ``patch`` (grade that patch).
    The request and answer carry the episode's ``/run`` shapes as Gym requires (Gym types them)."""

    responses_create_params: dict[str, Any]
    response: dict[str, Any]
    task_id: str
    episode_id: str | None = None
    patch: str | None = None


class Verdict(BaseModel):
    """The grade as the wire carries it: Gym's reward, mask and failure fields, and Polar's own."""

    reward: float
    mask_sample: bool = False
    failure_kind: str | None = None  # FailureKind.wire ("polar:<kind>"; None when graded cleanly)
    failure_reason: str | None = None
    resolved: bool = False
    patch_bytes: int = 0
    grading: dict[str, Any] = {}  # the GradeResult, its log tail left out


class VerifyResponse(Verdict):
    """The verdict, echoing the request's ``/run`` shapes and task as Gym's verify answers do."""

    responses_create_params: dict[str, Any]
    response: dict[str, Any]
    task_id: str

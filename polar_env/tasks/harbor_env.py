"""A Harbor task's ``[environment] env``: resolved from the host as harbor 0.25 resolves it, and kept
off the variables Polar sets for the sandbox's safety.

Harbor (``harbor.utils.env.resolve_env_vars``) reads a value that is exactly ``${VAR}`` from the host's
environment, ``${VAR:-default}`` likewise with a default when ``VAR`` is unset (set but empty stays
empty), and any other value as the literal it is (``a${X}b`` included); a ``${VAR}`` the host lacks is
an error. The same rule resolves ``[verifier] env`` (Harbor: ``resolve_env_vars`` on the verifier's
env too). A task names each host variable it takes, and its value reaches the agent: Harbor's contract
(tasks that need a key pass it this way), so run only tasks you trust with what they name.

Refused, with one error naming the task and the key (`reserved`): what every command's environment
is pinned to (HOME, USER, PATH, ... `sandbox.base.SandboxSpec.base_env`; root's execs run with
``PATH=/usr/bin:/bin``: a task's PATH belongs in its Dockerfile's ``ENV``), the proxy's address and
the session's key (``*_BASE_URL``, ``*_API_KEY``, proxies, ``POLAR_*``), and what would change the
root setup execs (chown, git snapshot and diff) that run with the sandbox's env: the loader's
``LD_*``, the shells' startup files, ``GIT_*``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

TEMPLATE_RE = re.compile(r"\$\{([^}:]+)(?::-(.*))?\}")  # harbor's _TEMPLATE_PATTERN, matched whole
PINNED = frozenset({"HOME", "USER", "LOGNAME", "HOSTNAME", "SHELL", "PATH", "PWD", "BASH_ENV", "ENV"})
RESERVED_RE = re.compile(
    r"POLAR_.*|LD_.*|GIT_.*|.*_BASE_URL|.*_API_BASE|.*_API_KEY|.*_AUTH_TOKEN"
    r"|(HTTPS?|ALL|NO|FTP)_PROXY",
    re.I,
)


class HarborEnvError(ValueError):
    """A task's env cannot be applied; the message names the task, the section and the key or variable."""


def resolve(env: Mapping[str, str], where: str, host: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` with each whole ``${VAR}`` / ``${VAR:-default}`` read from ``host`` (default: this
    process's environment), as Harbor resolves it; ``where`` names the task and section in the error."""
    host = os.environ if host is None else host
    out: dict[str, str] = {}
    for key, value in env.items():
        m = TEMPLATE_RE.fullmatch(value)
        if m is None:
            out[key] = value
        elif m.group(1) in host:
            out[key] = host[m.group(1)]
        elif m.group(2) is not None:
            out[key] = m.group(2)
        else:
            raise HarborEnvError(
                f"{where}: {key} = {value!r}, but ${{{m.group(1)}}} is not set in the host's "
                f"environment (set it, or give a default: ${{{m.group(1)}:-...}})"
            )
    return out


def reserved(key: str) -> bool:
    """Whether Polar sets (or pins for safety) ``key`` itself, so a task may not."""
    return key.upper() in PINNED or RESERVED_RE.fullmatch(key) is not None


def check_keys(env: Mapping[str, str], where: str) -> None:
    """Refuse the keys of ``env`` that Polar sets itself (`reserved`), all named in one error."""
    if bad := sorted(k for k in env if reserved(k)):
        raise HarborEnvError(
            f"{where}: {', '.join(bad)} cannot be set by a task: Polar sets "
            f"{'it' if len(bad) == 1 else 'them'} for the sandbox's safety (docs/tasks.md; "
            f"a PATH goes in the Dockerfile's ENV)"
        )


def container_env(env: Mapping[str, str], where: str) -> dict[str, str]:
    """``[environment] env`` (or ``[verifier.environment] env``) as a container gets it: resolved, checked."""
    resolved = resolve(env, where)
    check_keys(resolved, where)
    return resolved

"""Which of an episode's chains become training rows (``--train-paths``, docs/training.md).

An episode is one or more chains: the main one (it holds the task prompt), compaction summaries,
sub-agents, side calls. A run chooses which are trained:

- ``all`` (the default): every chain with a trainable token. Each chain is a sequence the policy
  really sampled, token-exact, and its tokens led to the reward as much as the main chain's did (a
  compaction summary decides what the rest of the episode remembers); dropping them trains the
  policy on the part of its behaviour it saw first only.
- ``main``: the main chain only (what NeMo-RL trains, its contract being one contiguous sequence
  per rollout).
- ``final``: the chain of the episode's last answered call (the one that produced the final answer).
- ``module:function``: ``function(trajectory) -> iterable of chain indices``, imported once.

Whatever the choice, a chain the harness did not start — its first call made by a tool process
(a command the agent ran, calling the proxy with the session's key) or of unknown origin (a
process that reached the proxy's socket around the sandbox's forwarder, or after the harness
ended), as the forwarder proved it (sandbox/forwarder.py) — is recorded but not trained, unless
the value ends with ``+foreign`` (``all+foreign``): the policy must not write its own training data.

Trainers that take one sequence per rollout (TRL's ``rollout_func``, NeMo-RL) get the first
selected chain (the main one when it is selected); the tokens of the other selected chains are
counted (``side_tokens``) and warned, as ``polar check`` does.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import cast

from polar_env.trajectory.models import Chain, Trajectory

TRAIN_PATHS = ("all", "main", "final")
FOREIGN = "+foreign"  # suffix: chains the harness did not start train too
Selector = Callable[[Trajectory], Iterable[int]]


def _all(traj: Trajectory) -> list[int]:
    return [ch.index for ch in traj.chains]


def _main(traj: Trajectory) -> list[int]:
    return [] if traj.main_chain is None else [traj.main_chain]


def _final(traj: Trajectory) -> list[int]:
    last = next((c.chain for c in reversed(traj.calls) if c.chain is not None), None)
    return [] if last is None else [last]


_BUILTIN: dict[str, Selector] = {"all": _all, "main": _main, "final": _final}


def harness_started(traj: Trajectory, index: int) -> bool:
    """Whether chain ``index``'s first call was the harness's (or is untagged: no forwarder proved
    otherwise)."""
    first = traj.chains[index].call_indices[0]
    return next((c.origin for c in traj.calls if c.call_index == first), None) not in ("tool", "unknown")


def selector(spec: str) -> Selector:
    """The selector a ``--train-paths`` value names (without ``+foreign``: only chains the harness
    started); ``ValueError`` naming the problem otherwise."""
    base = spec.removesuffix(FOREIGN)
    pick = _named(base)
    if base != spec:
        return pick
    return lambda traj: [i for i in pick(traj) if harness_started(traj, i)]


def _named(spec: str) -> Selector:
    if spec in _BUILTIN:
        return _BUILTIN[spec]
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"--train-paths {spec!r}: expected all, main, final or module:function (+foreign)")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--train-paths {spec!r}: cannot import it: {exc}") from exc
    if not callable(fn):
        raise ValueError(f"--train-paths {spec!r}: {module}.{name} is not callable")
    return cast(Selector, fn)


def train_chains(traj: Trajectory, paths: str | Selector = "all") -> list[Chain]:
    """The selected chains that hold a trainable token, in chain order (none for a masked episode)."""
    if traj.masked:
        return []
    pick = selector(paths) if isinstance(paths, str) else paths
    chosen = set(pick(traj))
    unknown = chosen - {ch.index for ch in traj.chains}
    if unknown:
        raise ValueError(
            f"train paths selected chains {sorted(unknown)} that {traj.session_id} does not have"
        )
    return [ch for ch in traj.chains if ch.index in chosen and ch.trainable_tokens]


def one_chain(traj: Trajectory, paths: str | Selector = "all") -> tuple[Chain | None, int]:
    """For a trainer of one sequence per rollout: the main chain when selected, else the first
    selected one; and the trainable tokens of the selected chains it leaves out."""
    chains = train_chains(traj, paths)
    if not chains:
        return None, 0
    chosen = next((ch for ch in chains if ch.index == traj.main_chain), chains[0])
    return chosen, sum(ch.trainable_tokens for ch in chains if ch is not chosen)


def policy_versions(traj: Trajectory, chain: Chain) -> list[int]:
    """The distinct policy versions that sampled ``chain``'s calls, ascending."""
    calls = set(chain.call_indices)
    return sorted(
        {c.policy_version for c in traj.calls if c.call_index in calls and c.policy_version is not None}
    )

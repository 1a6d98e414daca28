"""`polar rollout`: K rollouts per task (GRPO groups), N talking to the model at once, resumable, on disk as
they end.

One module per job: ``config`` (the typed settings the CLI, Ray and the demo share), ``plan`` (which
episodes, which are done, each stage's limit), ``outputs`` (what lands in ``--out``), ``progress``
(the bar), ``runner`` (episodes on this host through one proxy, stage by stage: docs/rollout.md),
``ray`` (the same spread over a Ray cluster) and ``cli``.

Layout of ``--out``:
  ledger/               the proxy's write-ahead log (every model call of every episode;
                        with --ray, ledger/nodes/<node>/ per node, see polar_env.rollout.ray)
  trajectories.jsonl    Polar trajectories, one per finished episode, appended as each ends
  nemo_results.jsonl    the same episodes as NeMo-RL ``/run`` results (rebuilt at the end)
  grpo_batch.jsonl      per-chain rows with group-normalised advantages (rewritten at the end)
  summary.json          counts, resolved rate, tokens, time
A rerun on the same ``--out`` skips every episode already in trajectories.jsonl; an episode cut off
by an interrupt runs again as a new attempt (session ``<task>.s<k>.a<n+1>``), its partial ledger kept.
"""

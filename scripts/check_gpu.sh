#!/usr/bin/env bash
# The first check on a GPU machine: one GPU, the weights on local disk, no network. One short real
# episode per seed harness (Codex, Claude Code, Pi) against a real vLLM server returning processed
# logprobs and labelling its weights, then, per harness, the NeMo-RL contract check (`polar check` on the
# /run results: contiguity, finite logprobs, the version each call recorded) and the rescored drift
# (the recorded logprobs against one float32 forward pass of the same weights, on the GPU once vLLM is
# gone). Target: under 10 minutes on one H100 with Qwen3.5-4B. docs/nemo.md, "First run on a GPU".
#
#   scripts/check_gpu.sh MODEL_DIR [HARNESS ...]      (default harnesses: codex claude-code pi)
#
# Prepared beforehand, while online (the script installs nothing):
#   POLAR_SETUP_HARNESSES=1 bash scripts/setup.sh      Polar's .venv, bubblewrap, the harness CLIs
#   scripts/check_vllm_gpu.sh MODEL_DIR                the vLLM venv (.venv-vllm-gpu) and a first serve
#   .venv/bin/polar rollout --harness pi --task-ids psf__requests-5414 --policy gold --out /tmp/warm
#                                                      the task's test environment, cached
# Environment: VLLM_VENV (default <repo>/.venv-vllm-gpu), PORT (8011), TASK (psf__requests-5414),
# VLLM_ARGS (default "--max-model-len 32768 --gpu-memory-utilization 0.85 --enable-prefix-caching"),
# MAX_TOKENS per call (4096), MAX_CALLS per episode (12), EPISODE_TIMEOUT_S (240), RESCORE_DEVICE (cuda),
# MAX_MEAN_DRIFT (0.05: mean |recorded - rescored| over the trainable tokens; ~0.005 is healthy),
# OUT (a new temp dir). Exit status 0: every harness's episode passed both checks.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:?usage: scripts/check_gpu.sh MODEL_DIR [HARNESS ...]}"
shift
HARNESSES=("${@:-codex claude-code pi}")
read -r -a HARNESSES <<< "${HARNESSES[*]}"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm-gpu}"
PORT="${PORT:-8011}"
TASK="${TASK:-psf__requests-5414}"
VLLM_ARGS="${VLLM_ARGS:---max-model-len 32768 --gpu-memory-utilization 0.85 --enable-prefix-caching}"
MAX_TOKENS="${MAX_TOKENS:-4096}"
MAX_CALLS="${MAX_CALLS:-12}"
EPISODE_TIMEOUT_S="${EPISODE_TIMEOUT_S:-240}"
RESCORE_DEVICE="${RESCORE_DEVICE:-cuda}"
MAX_MEAN_DRIFT="${MAX_MEAN_DRIFT:-0.05}"
OUT="${OUT:-$(mktemp -d -t polar-gpu-check.XXXXXX)}"
URL="http://127.0.0.1:$PORT"
POLAR="$ROOT/.venv/bin/polar"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
started=$(date +%s)
say() { echo "[check_gpu $(( $(date +%s) - started ))s] $*"; }

[ -f "$MODEL/config.json" ] || { echo "no model at $MODEL (a local directory with config.json)" >&2; exit 2; }
"$VENV/bin/python" -c "import vllm" 2>/dev/null \
  || { echo "no vLLM in $VENV: run scripts/check_vllm_gpu.sh $MODEL once while online" >&2; exit 2; }
[ -x "$POLAR" ] || { echo "no Polar venv: run POLAR_SETUP_HARNESSES=1 bash scripts/setup.sh while online" >&2; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
mkdir -p "$OUT"

# vLLM: processed logprobs (the distribution sampled from), its RL API on (the weights' label)
# shellcheck disable=SC2086
VLLM_SERVER_DEV_MODE=1 setsid "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
  --served-model-name polar-policy --host 127.0.0.1 --port "$PORT" --logprobs-mode processed_logprobs \
  $VLLM_ARGS >"$OUT/vllm.log" 2>&1 &
SERVER=$!
stop_server() { kill -TERM -- -"$SERVER" 2>/dev/null || true; for _ in 1 2 3 4 5 6 7 8 9 10; do
  kill -0 "$SERVER" 2>/dev/null || return 0; sleep 1; done; kill -KILL -- -"$SERVER" 2>/dev/null || true; }
trap stop_server EXIT
until curl -sf "$URL/health" >/dev/null; do
  if ! kill -0 "$SERVER" 2>/dev/null || (( $(date +%s) - started > 420 )); then
    echo "vLLM did not become healthy; last lines of $OUT/vllm.log:" >&2; tail -n 60 "$OUT/vllm.log" >&2; exit 1
  fi
  sleep 2
done
say "vLLM healthy ($MODEL)"
# label the weights as a trainer's sync would: every call must record version 1, read from the server
curl -sf -X POST "$URL/update_weight_version" -H 'Content-Type: application/json' -d '{"new_version": "1"}' >/dev/null

# one episode per harness, all at once (vLLM batches them)
pids=()
for h in "${HARNESSES[@]}"; do
  "$POLAR" rollout --harness "$h" --backend vllm --url "$URL" --model-dir "$MODEL" --model-name polar-policy \
    --task-ids "$TASK" --samples 1 --temperature 1.0 --top-p 1.0 --max-tokens "$MAX_TOKENS" --max-calls "$MAX_CALLS" \
    --timeout "$EPISODE_TIMEOUT_S" --out "$OUT/$h" >"$OUT/$h.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!HARNESSES[@]}"; do
  if wait "${pids[$i]}"; then say "${HARNESSES[$i]}: episode done"; else
    say "${HARNESSES[$i]}: polar rollout failed (log: $OUT/${HARNESSES[$i]}.log)"; status=1; fi
done
stop_server  # the GPU is the rescorer's now
trap - EXIT

for h in "${HARNESSES[@]}"; do
  [ -f "$OUT/$h/nemo_results.jsonl" ] || { status=1; continue; }
  say "$h: the NeMo-RL contract check"
  "$POLAR" check "$OUT/$h/nemo_results.jsonl" --samples 1 || status=1
  "$ROOT/.venv/bin/python" - "$OUT/$h" <<'EOF' || status=1
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
summary = json.loads((run / "summary.json").read_text())
(traj,) = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines() if line]
print(f"   logprobs {summary['logprobs_mode']}, calls {summary['calls']}, sampled {summary['sampled_tokens']}, "
      f"versions {summary['policy_versions']}, unversioned {summary['unversioned_calls']}, "
      f"single-call {summary['single_call_rollouts']}, context-only turns {summary['context_only_turns']}, "
      f"reward {traj['reward']}, status {traj['status']}")
problems = [p for p, bad in (("logprobs are not processed", summary["logprobs_mode"] != ["processed"]),
                             ("a call is not labelled with the server's version 1", summary["policy_versions"] != [1]
                              or summary["unversioned_calls"]),
                             ("no model call was answered", not summary["sampled_tokens"])) if bad]
for p in problems:
    print(f"   FAIL: {p}")
sys.exit(1 if problems else 0)
EOF
  say "$h: rescored drift ($RESCORE_DEVICE, float32)"
  "$POLAR" check "$OUT/$h/trajectories.jsonl" --rescore "$MODEL" --device "$RESCORE_DEVICE" --max-diff 5 \
    | tee "$OUT/$h.rescore.txt" || status=1
  "$ROOT/.venv/bin/python" - "$OUT/$h.rescore.txt" "$MAX_MEAN_DRIFT" <<'EOF' || status=1
import re, sys
text = open(sys.argv[1]).read()
found = re.search(r"mean \|diff\| ([0-9.eE+-]+)", text)
if found is None:
    sys.exit("   FAIL: no rescore line in polar check's report")
mean = float(found.group(1))
print(f"   mean |recorded - rescored| {mean:.4g} (limit {sys.argv[2]})")
sys.exit(0 if mean <= float(sys.argv[2]) else 1)
EOF
done
elapsed=$(( $(date +%s) - started ))
say "done in ${elapsed}s: $([ $status = 0 ] && echo PASSED || echo FAILED); outputs in $OUT"
(( elapsed <= 600 )) || say "over the 10-minute target"
exit $status

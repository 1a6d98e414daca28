#!/usr/bin/env bash
# Check the `vllm` backend against a real vLLM server on a GPU machine: install vLLM, serve a
# model, send two contiguous turns through polar_env.backends.check_vllm, print its JSON report.
#
#   scripts/check_vllm_gpu.sh [MODEL]        MODEL: hub name or local directory (default Qwen/Qwen3-0.6B)
#
# Environment: VLLM_VENV (default <repo>/.venv-vllm-gpu; reused when it already imports vllm),
# VLLM_VERSION (pin, default latest), PORT (default 8011), VLLM_ARGS (extra `serve` arguments,
# default "--max-model-len 8192"), STARTUP_TIMEOUT_S (default 900). Exit status 0 = check passed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:-Qwen/Qwen3-0.6B}"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm-gpu}"
PORT="${PORT:-8011}"
VLLM_ARGS="${VLLM_ARGS:---max-model-len 8192}"
STARTUP_TIMEOUT_S="${STARTUP_TIMEOUT_S:-900}"
URL="http://127.0.0.1:$PORT"
LOG="$(mktemp -t polar-vllm-check.XXXXXX.log)"

if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  start=$(date +%s)
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --upgrade pip
  "$VENV/bin/pip" install "vllm${VLLM_VERSION:+==$VLLM_VERSION}"
  echo "installed vLLM in $(( $(date +%s) - start )) s"
fi

# its own process group, so stopping it also stops the engine processes it forks
# shellcheck disable=SC2086
setsid "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
  --served-model-name polar-check --host 127.0.0.1 --port "$PORT" $VLLM_ARGS >"$LOG" 2>&1 &
SERVER=$!
trap 'kill -TERM -- -"$SERVER" 2>/dev/null || true; sleep 3; kill -KILL -- -"$SERVER" 2>/dev/null || true' EXIT

start=$(date +%s)
until curl -sf "$URL/health" >/dev/null; do
  if ! kill -0 "$SERVER" 2>/dev/null || (( $(date +%s) - start > STARTUP_TIMEOUT_S )); then
    echo "vLLM did not become healthy; last lines of $LOG:" >&2
    tail -n 60 "$LOG" >&2
    exit 1
  fi
  sleep 2
done
echo "vLLM healthy in $(( $(date +%s) - start )) s (log: $LOG)"

PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" -m polar_env.backends.check_vllm \
  --url "$URL" --model-dir "$MODEL" --model polar-check

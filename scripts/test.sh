#!/usr/bin/env bash
# The whole test suite on a fresh machine: sets everything up itself (venv, apt packages, the
# harness CLIs from npm, the vLLM CPU server venv, the NeMo Gym venv, Chromium, podman and its
# locally built base image), then lint + pytest
# (unit and slow end-to-end tests).
set -euo pipefail
cd "$(dirname "$0")/.."
POLAR_SETUP_HARNESSES=${POLAR_SETUP_HARNESSES:-1} POLAR_SETUP_VLLM=${POLAR_SETUP_VLLM:-1} \
  POLAR_SETUP_GYM=${POLAR_SETUP_GYM:-1} POLAR_SETUP_BROWSER=${POLAR_SETUP_BROWSER:-1} \
  POLAR_SETUP_CONTAINERS=${POLAR_SETUP_CONTAINERS:-1} bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest "$@"

#!/usr/bin/env bash
# The whole test suite on a fresh machine: sets everything up itself (venv, apt packages, the
# harness CLIs from npm, the vLLM CPU server venv, the NeMo Gym venv, Chromium, podman and its
# locally built base image), then lint + pytest
# (unit and slow end-to-end tests).
set -euo pipefail
cd "$(dirname "$0")/.."
POLAR_SETUP_HARNESSES=${POLAR_SETUP_HARNESSES:-1} POLAR_SETUP_VLLM=${POLAR_SETUP_VLLM:-1} \
  POLAR_SETUP_GYM=${POLAR_SETUP_GYM:-1} POLAR_SETUP_BROWSER=${POLAR_SETUP_BROWSER:-1} \
  POLAR_SETUP_CONTAINERS=${POLAR_SETUP_CONTAINERS:-1} POLAR_SETUP_HARBOR=${POLAR_SETUP_HARBOR:-1} bash scripts/setup.sh
.venv/bin/ruff check .
# Given test paths, one pytest run over them. The whole suite runs one pytest process per test file
# (the vLLM ones together): a file's models, servers and threads are gone before the next file
# starts (the suite in a single process outgrew this 24 GB machine's memory).
for arg in "$@"; do
  case "$arg" in -*) ;; *) exec .venv/bin/python -m pytest "$@" ;; esac
done
# The files that use the vLLM server fixture run together, so they share one server start.
vllm_files=$(grep -l "vllm_server" tests/test_*.py | tr '\n' ' ')
groups=()
for file in tests/test_*.py; do
  case " $vllm_files " in *" $file "*) ;; *) groups+=("$file") ;; esac
done
[ -n "$vllm_files" ] && groups+=("$vllm_files")
failed=()
for group in "${groups[@]}"; do
  rc=0
  # shellcheck disable=SC2086  # a group is space-separated file names
  .venv/bin/python -m pytest "$@" $group || rc=$?
  if [ "$rc" != 0 ] && [ "$rc" != 5 ]; then failed+=("$group (exit $rc)"); fi  # 5: nothing selected
done
if [ ${#failed[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "all test files passed"

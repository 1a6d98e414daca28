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
# Given test paths, one pytest run over them.
for arg in "$@"; do
  case "$arg" in -*) ;; *) exec .venv/bin/python -m pytest "$@" ;; esac
done
# The whole suite runs one pytest process per test file: a file's models, servers and threads are
# gone before the next file starts (the suite in a single process outgrew this 24 GB machine's
# memory). POLAR_TEST_JOBS processes (default 2, one per core here) run at once; files that share
# a machine-wide resource run one after another in one job: those using the vLLM server fixture
# (they share one server start), and those using NeMo Gym servers or podman (fixed ports, one
# container engine).
vllm_files=$(grep -l "vllm_server" tests/test_*.py | tr '\n' ' ')
engine_files=$(grep -lE "gym_helpers|ng_run|\.venv-gym|podman" tests/test_*.py | tr '\n' ' ')
jobs=()
[ -n "$vllm_files" ] && jobs+=("$vllm_files")
engine_job=""
for file in $engine_files; do
  case " $vllm_files " in *" $file "*) ;; *) engine_job+="$file " ;; esac
done
[ -n "$engine_job" ] && jobs+=("$engine_job")
for file in tests/test_*.py; do
  case " $vllm_files $engine_job " in *" $file "*) ;; *) jobs+=("$file") ;; esac
done
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
run_job() {  # one job's files, one pytest process each; its output and failures land in $logs/$1.*
  local idx=$1 files=$2 rc t0
  # the vLLM files share one process (one server start); the others one process per file
  local runs=("$files")
  case " $vllm_files " in " $files ") ;; *) read -ra runs <<< "$files" ;; esac
  for run in "${runs[@]}"; do
    rc=0 t0=$SECONDS
    # shellcheck disable=SC2086  # a run is space-separated file names
    .venv/bin/python -m pytest "${pytest_args[@]}" $run >> "$logs/$idx.out" 2>&1 || rc=$?
    echo "== $run: exit $rc, $((SECONDS - t0)) s" >> "$logs/$idx.out"
    if [ "$rc" != 0 ] && [ "$rc" != 5 ]; then echo "$run (exit $rc)" >> "$logs/$idx.failed"; fi  # 5: nothing selected
  done
  touch "$logs/$idx.done"
}
shown=()
show_finished() {  # print each finished job's output once, whole, so parallel jobs do not interleave
  local i
  for i in "${!jobs[@]}"; do
    if [ -e "$logs/$i.done" ] && [ -z "${shown[$i]:-}" ]; then
      cat "$logs/$i.out"
      shown[$i]=1
    fi
  done
}
pytest_args=("$@")
max_jobs=${POLAR_TEST_JOBS:-2}
for i in "${!jobs[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$max_jobs" ]; do wait -n || true; show_finished; done
  run_job "$i" "${jobs[$i]}" &
done
wait
show_finished
failed=$(cat "$logs"/*.failed 2>/dev/null || true)
if [ -n "$failed" ]; then
  printf 'FAILED: %s\n' "$failed"
  exit 1
fi
echo "all test files passed"

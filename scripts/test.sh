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
# The whole suite: the type checker over polar_env first ([tool.pyright] in pyproject.toml).
.venv/bin/pyright
# Then the fast files (no `pytest.mark.slow` test: models, servers and sandboxes
# small and short-lived) share one pytest process, sparing each its interpreter start and
# imports; every slow file runs in its own process, so that a file's fixtures, servers and harness
# processes never meet another's (the suite once outgrew this 24 GB machine's memory in one process:
# aiohttp's middleware-chain cache kept every stopped proxy and its backend alive, fixed in
# proxy/app.py; eight slow files in one process now end at 1.6 GB, not 3.9). POLAR_TEST_JOBS processes (default 2, one per core here) run
# at once. Files that share a machine-wide resource run one after another in one job: those using the
# vLLM server fixture (they share one server start, in one process) and those starting NeMo Gym's
# servers (the docs' commands use Gym's fixed ports). Podman is not such a resource: every container a
# test process creates carries its own label (tests/own_containers.py) and its checks count only those.
# Longest job first, by tests/durations.tsv (seconds and run, one line per pytest run, from an
# earlier full run: this script writes the new figures to $POLAR_TEST_DURATIONS_OUT when set), so
# that no long file starts last; a run it does not list counts 60 s a file.
# the test files, by package (tests/<package>/test_*.py; a flat tests/test_*.py still runs), in one
# order everywhere (tests/durations.tsv keys a one-process run by its files in this order)
mapfile -t test_files < <(shopt -s nullglob; printf '%s\n' tests/test_*.py tests/*/test_*.py | LC_ALL=C sort)
vllm_files=$(grep -l "vllm_server" "${test_files[@]}" | tr '\n' ' ')
gym_files=$(grep -lE "^from gym_helpers|^import gym_helpers" "${test_files[@]}" | tr '\n' ' ')
jobs=()
[ -n "$vllm_files" ] && jobs+=("$vllm_files")
gym_job=""
for file in $gym_files; do
  case " $vllm_files " in *" $file "*) ;; *) gym_job+="$file " ;; esac
done
[ -n "$gym_job" ] && jobs+=("$gym_job")
unit_job=""
for file in "${test_files[@]}"; do
  case " $vllm_files $gym_job " in
    *" $file "*) ;;
    *) if grep -q "pytest.mark.slow" "$file"; then jobs+=("$file"); else unit_job+="$file "; fi ;;
  esac
done
[ -n "$unit_job" ] && jobs+=("$unit_job")
one_process() {  # whether a job's files run as one pytest process (the vLLM files, the fast files)
  case " $1 " in " $vllm_files "|" $unit_job ") return 0 ;; *) return 1 ;; esac
}
expected_s() {  # a job's expected seconds: its runs' figures in tests/durations.tsv
  local files=$1
  if one_process "$files"; then
    awk -F'\t' -v run="${files% }" -v n="$(wc -w <<< "$files")" '$2 == run {s = $1} END {print s ? s : 60 * n}' \
      tests/durations.tsv
  else
    awk -F'\t' -v runs="$files" 'BEGIN {n = split(runs, r, " "); for (i = 1; i <= n; i++) want[r[i]] = 60}
         $2 in want {want[$2] = $1} END {for (f in want) s += want[f]; print s}' tests/durations.tsv
  fi
}
mapfile -t jobs < <(for job in "${jobs[@]}"; do printf '%s\t%s\n' "$(expected_s "$job")" "$job"; done \
                    | sort -t$'\t' -k1,1nr | cut -f2)
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
run_job() {  # one job's runs (its files in one pytest process, or one process per file); its output and failures land in $logs/$1.*
  local idx=$1 files=$2 rc t0
  local runs=("$files")
  one_process "$files" || read -ra runs <<< "$files"
  for run in "${runs[@]}"; do
    rc=0 t0=$SECONDS
    # shellcheck disable=SC2086  # a run is space-separated file names
    .venv/bin/python -m pytest "${pytest_args[@]}" $run >> "$logs/$idx.out" 2>&1 || rc=$?
    echo "== $run: exit $rc, $((SECONDS - t0)) s" >> "$logs/$idx.out"
    printf '%s\t%s\n' "$((SECONDS - t0))" "${run% }" >> "$logs/$idx.durations"
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
# The cores shared out among the jobs as torch's (OpenMP's) threads, so that parallel jobs never ask
# for more threads than there are cores (CI once took 1069 s for test_training_sft.py, 86 s here; on this
# 2-core machine the two training files side by side took the same either way). vLLM sets its own.
cores=$(nproc)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( cores / max_jobs > 0 ? cores / max_jobs : 1 ))}
for i in "${!jobs[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$max_jobs" ]; do wait -n || true; show_finished; done
  run_job "$i" "${jobs[$i]}" &
done
wait
show_finished
if [ -n "${POLAR_TEST_DURATIONS_OUT:-}" ]; then sort -t$'\t' -k1,1nr "$logs"/*.durations > "$POLAR_TEST_DURATIONS_OUT"; fi
failed=$(cat "$logs"/*.failed 2>/dev/null || true)
if [ -n "$failed" ]; then
  printf 'FAILED: %s\n' "$failed"
  exit 1
fi
echo "all test files passed"

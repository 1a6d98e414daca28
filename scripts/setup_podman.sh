#!/usr/bin/env bash
# Podman for container workspaces and grading in task images (called by setup.sh when
# POLAR_SETUP_CONTAINERS=1). Installs podman (+ its docker-compatible CLI) and runc, writes the
# engine config this kind of VM needs (it cannot raise rlimits and mixes cgroup v1/v2, which crun
# refuses), and builds the Debian base image locally (no image registry is needed): the bubblewrap
# sandboxes' root (polar_env/sandbox/rootfs.py, a minbase bookworm from debootstrap), imported as
# polar-base:<key>, key = that root's recipe hash. Idempotent: an existing polar-base:<key> is reused.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "setup_podman: needs root (apt-get, /etc/containers); run it as root or install podman yourself" >&2
  exit 2
fi
need=()
command -v podman >/dev/null || need+=(podman podman-docker)
command -v runc >/dev/null || need+=(runc)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup_podman: apt-get install ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

conf=/etc/containers/containers.conf
if ! grep -q 'polar_env' "$conf" 2>/dev/null; then
  mkdir -p /etc/containers
  cat > "$conf" <<'CONF'
# written by polar_env scripts/setup_podman.sh
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
  echo "setup_podman: wrote $conf"
fi

PYTHONPATH=$PWD .venv/bin/python -m polar_env.tasks.images base

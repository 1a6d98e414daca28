#!/usr/bin/env bash
# The NeMo Gym venv (.venv-gym) for running Polar as a NeMo Gym environment (`ng_run`,
# `ng_collect_rollouts`, `ng_test`). Idempotent.
#
# nemo-gym 0.7.0 declares Python >= 3.13.14. Where only an older 3.13 exists (this CI machine has
# pyenv 3.13.0), it is installed with --ignore-requires-python: a machine workaround, not a
# requirement of Polar. Set POLAR_GYM_PYTHON to choose the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
GYM_VERSION=${POLAR_GYM_VERSION:-0.7.0}

find_python() {
  if [ -n "${POLAR_GYM_PYTHON:-}" ]; then echo "$POLAR_GYM_PYTHON"; return; fi
  for cand in python3.13 "$HOME/.pyenv/versions/3.13.0/bin/python3.13"; do
    # (a pyenv shim exists even where that version is not selected: ask it to run)
    if "$cand" -c "import sys; assert sys.version_info[:2] == (3, 13)" >/dev/null 2>&1; then
      command -v "$cand"; return
    fi
  done
  echo "setup_nemo_gym: no Python 3.13 found (set POLAR_GYM_PYTHON)" >&2
  exit 1
}

if [ ! -x .venv-gym/bin/python ]; then
  PY=$(find_python)
  echo "setup_nemo_gym: creating .venv-gym with $PY"
  "$PY" -m venv .venv-gym
fi
if ! .venv-gym/bin/python -c "import importlib.metadata as m; assert m.version('nemo-gym') == '$GYM_VERSION'" 2>/dev/null; then
  flags=()
  .venv-gym/bin/python - <<'PYEOF' || flags+=(--ignore-requires-python)
import sys
sys.exit(0 if sys.version_info >= (3, 13, 14) else 1)
PYEOF
  echo "setup_nemo_gym: installing nemo-gym==$GYM_VERSION ${flags[*]:-}"
  .venv-gym/bin/pip install -q --upgrade pip
  .venv-gym/bin/pip install -q "${flags[@]}" "nemo-gym==$GYM_VERSION"
fi
# What Polar's servers import besides nemo-gym: polar_env from this checkout, installed from a
# server's requirements.txt the way Gym does it (from the server's directory), and what
# `gym env test` runs their tests with. (-I: the check must not find polar_env through the cwd.)
# (the servers' own modules are imported too, so a dependency polar_env added since this venv was made is installed)
.venv-gym/bin/python -I -c "import polar_env, pytest, pytest_asyncio, httpx, sys
import polar_env.agent_server.core, polar_env.resources_server.core
sys.exit(polar_env.__file__ != '$PWD/polar_env/__init__.py')" 2>/dev/null \
  || (cd nemo_gym_env/resources_servers/polar \
      && ../../../.venv-gym/bin/pip install -q -r requirements.txt pytest pytest-asyncio httpx)
# `gym env start` builds one uv venv per server: uv must be on PATH (.venv-gym/bin is enough).
.venv-gym/bin/python -c "import importlib.util as u; assert u.find_spec('uv')" 2>/dev/null \
  || .venv-gym/bin/pip install -q uv
# Gym builds one uv venv per server; on Python < 3.13.14 uv cannot (nemo-gym refuses the interpreter).
# .gym-venvs/<type>/<name>/.venv link to .venv-gym instead, used with `+skip_venv_if_present=true
# +uv_venv_dir=$PWD/.gym-venvs` (docs/nemo.md's commands; also faster than building them).
for server in resources_servers/polar responses_api_agents/polar_agent environment_servers/legacy_agent; do
  mkdir -p ".gym-venvs/$server"
  ln -sfn "$PWD/.venv-gym" ".gym-venvs/$server/.venv"
done
echo "setup_nemo_gym: $(.venv-gym/bin/python -c 'import importlib.metadata as m; print("nemo-gym", m.version("nemo-gym"))') in .venv-gym"

#!/usr/bin/env bash
# Create .venv-harbor: the `harbor` package (0.25.0, Python >= 3.12), for the conformance test of
# Polar's Harbor support (tests/tasks/test_harbor_conformance.py: harbor's own task model accepts every
# folder `polar tasks export --format harbor` writes; Polar loads harbor's template task).
# A venv of its own: harbor needs Python 3.12 and pins its own web stack. Idempotent: a venv whose
# harbor is the pinned version is left alone.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-harbor}"
HARBOR_VERSION="${HARBOR_VERSION:-0.25.0}"
PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  for candidate in python3.12 python3.13 "$HOME/.pyenv/versions/3.12.1/bin/python" "$HOME/.pyenv/versions/3.13.0/bin/python"; do
    if "$candidate" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then PYTHON=$candidate; break; fi
  done
fi
[ -n "$PYTHON" ] || { echo "setup_harbor: no Python >= 3.12 found (set PYTHON=...)" >&2; exit 1; }

if "$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('harbor') == '$HARBOR_VERSION'" 2>/dev/null; then
  echo "harbor venv already set up: $VENV"
  exit 0
fi
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q "harbor==$HARBOR_VERSION"
echo "setup_harbor: harbor $HARBOR_VERSION in $VENV"

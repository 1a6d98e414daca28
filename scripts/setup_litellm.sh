#!/usr/bin/env bash
# Create .venv-litellm: LiteLLM's proxy server, the comparison path of the full `polar bench`
# (bench/paths.py looks for it there). A venv of its own because LiteLLM pins its own
# web stack and SDK versions. Idempotent: a venv whose litellm is the pinned version is left alone.
#
# The pin: 1.107.0 was a compromised release, and the `proxy` extra of later ones needs packages
# (litellm-proxy, litellm-proxy-extras post-releases) that the package index here does not carry.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-litellm}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
LITELLM_VERSION="${LITELLM_VERSION:-1.106.12}"

if "$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('litellm') == '$LITELLM_VERSION'" 2>/dev/null \
    && [ -x "$VENV/bin/litellm" ]; then
  echo "LiteLLM venv already set up: $VENV"
  exit 0
fi
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q "litellm[proxy]==$LITELLM_VERSION"
echo "setup_litellm: litellm $LITELLM_VERSION in $VENV"

#!/usr/bin/env bash
# The main job on a fresh machine: set up (apt packages, venv, embedded model), then `polar demo`
# (Pi from npm in a bubblewrap sandbox, through the proxy, against the embedded SmolLM2, graded on
# the bundled SWE-bench Verified tasks). Extra arguments go to `polar demo` (e.g. --quick, --harness codex).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/polar demo "$@"

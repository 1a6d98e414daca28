#!/bin/bash
set -euo pipefail
python3 - <<'PY'
src = open("/app/stats.py").read()
src = src.replace("    return ordered[len(ordered) // 2]\n",
                  "    n = len(ordered)\n"
                  "    if n % 2:\n"
                  "        return ordered[n // 2]\n"
                  "    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2\n")
src = src.replace("    return max(counts, key=counts.get)\n",
                  "    top = max(counts.values())\n"
                  "    return min(v for v, c in counts.items() if c == top)\n")
open("/app/stats.py", "w").write(src)
PY

#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import json, re
text = open("/app/inventory.json").read()
text = re.sub(r"^\s*//.*$", "", text, flags=re.M)
text = text.replace("'name'", '"name"')
text = re.sub(r",(\s*[}\]])", r"\1", text)
data = json.loads(text)
open("/app/inventory.json", "w").write(json.dumps(data, indent=2) + "\n")
PY

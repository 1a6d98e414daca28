#!/bin/bash
set -euo pipefail
cd /app
sed -i -e 's/^port = .*/port = 8080/' -e 's/^\[logging$/[logging]/' -e 's/^level = .*/level = INFO/' service.ini
python3 service.py --check

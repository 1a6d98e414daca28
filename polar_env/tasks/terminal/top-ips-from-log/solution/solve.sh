#!/bin/bash
set -euo pipefail
awk '{print $1}' /app/access.log | sort | uniq -c | awk '{print $1, $2}' | sort -k1,1nr -k2,2 | head -n 3 > /app/top_ips.txt
cat /app/top_ips.txt

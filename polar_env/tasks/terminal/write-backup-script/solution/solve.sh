#!/bin/bash
set -euo pipefail
cat > /app/backup.sh <<'SH'
#!/bin/bash
set -euo pipefail
tar -C /app/data --exclude='*.tmp' -czf /app/backup.tar.gz .
SH
chmod +x /app/backup.sh
/app/backup.sh

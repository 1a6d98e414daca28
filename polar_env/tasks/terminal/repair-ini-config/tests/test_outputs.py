"""Checks of the repaired /app/service.ini, with a pristine copy of the service's checker."""

import configparser
import subprocess
import sys

proc = subprocess.run(
    [sys.executable, "/tests/service.py", "--check", "/app/service.ini"], capture_output=True, text=True
)
print(proc.stdout)
assert proc.returncode == 0, "the service's check still fails"
cfg = configparser.ConfigParser()
cfg.read("/app/service.ini")
assert cfg.get("server", "port") == "8080", "port must be 8080"
assert cfg.get("logging", "level") == "INFO", "level must be INFO"
# the settings that were valid are kept
assert cfg.get("server", "host") == "0.0.0.0"
assert cfg.get("server", "workers") == "4"
assert cfg.get("logging", "file") == "/var/log/service.log"
assert cfg.get("database", "url") == "sqlite:////app/data.db"
assert cfg.get("database", "pool_size") == "5"
print("all checks passed")

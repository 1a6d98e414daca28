"""A tiny service whose --check validates its configuration file."""

import configparser
import sys

LEVELS = {"DEBUG", "INFO", "WARNING", "ERROR"}


def check(path):
    errors = []
    cfg = configparser.ConfigParser()
    try:
        if not cfg.read(path):
            return [f"{path}: cannot read"]
    except configparser.Error as exc:
        return [f"{path}: {exc.message.splitlines()[0]}"]
    for section in ("server", "logging", "database"):
        if not cfg.has_section(section):
            errors.append(f"missing section [{section}]")
    if errors:
        return errors
    port = cfg.get("server", "port", fallback="")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        errors.append(f"server.port {port!r} is not a port number")
    if cfg.get("server", "host", fallback="") == "":
        errors.append("server.host is empty")
    if cfg.get("logging", "level", fallback="") not in LEVELS:
        errors.append(f"logging.level must be one of {sorted(LEVELS)}")
    if not cfg.get("database", "url", fallback="").startswith("sqlite:///"):
        errors.append("database.url must be a sqlite:/// URL")
    return errors


if __name__ == "__main__":
    problems = check(sys.argv[2] if len(sys.argv) > 2 else "/app/service.ini")
    for p in problems:
        print("config error:", p)
    print("config ok" if not problems else f"{len(problems)} error(s)")
    sys.exit(1 if problems else 0)

#!/usr/bin/env python3
"""Stand-in for `apptainer exec` (apptainer cannot be installed here): the same command run as a
`podman run` of the same image, with its binds (read-only ones too), user (`--security uid:N,gid:N`,
else root, as apptainer run by root), environment (`--env`, read as the CSV apptainer reads), host
name, network and working directory. A test through it checks how Polar drives apptainer (the argv,
the binds a box keeps, its locks), not apptainer itself; `apptainer version` answers as installed.
Every call is logged to $FAKE_APPTAINER_LOG."""

import csv
import os
import sys

argv = sys.argv[1:]
with open(os.environ["FAKE_APPTAINER_LOG"], "a") as log:
    log.write(" ".join(argv) + "\n")
if argv == ["version"]:  # what `polar` asks to see that apptainer is installed (episodes/workspace.py)
    print("apptainer version 1.3.4 (Polar's test stand-in)")
    sys.exit(0)
assert argv[0] == "exec", argv
out = ["podman", "run", "--rm", "-i", "--label", "polar_env=1", "-e", "HOME=/tmp"]
labels = os.environ.get("POLAR_CONTAINER_LABELS", "")
out += [a for kv in labels.split(",") if kv.strip() for a in ("--label", kv.strip())]
user, i = "0:0", 1
while argv[i].startswith("--"):
    flag = argv[i]
    if flag in ("--containall", "--cleanenv", "--writable-tmpfs", "--net"):
        i += 1
        continue
    value = argv[i + 1]
    i += 2
    if flag == "--security":
        ids = dict(part.split(":") for part in value.split(","))
        user = f"{ids['uid']}:{ids['gid']}"
    elif flag in ("--bind", "--home"):
        out += ["-v", value]
    elif flag == "--env":
        out += [a for pair in next(csv.reader([value])) for a in ("-e", pair)]
    elif flag == "--hostname":
        out += ["--hostname", value]
    elif flag == "--network":
        out += ["--network", value]
    elif flag == "--pwd":
        out += ["-w", value]
    elif flag != "--no-mount":
        raise SystemExit(f"apptainer stand-in: unknown flag {flag}")
image = argv[i].removeprefix("docker://")
os.execvp("podman", [*out, "--user", user, image, *argv[i + 1 :]])

"""Run /app/backup.sh on a changed data dir and check the archive it writes."""

import os
import subprocess
import tarfile

assert os.access("/app/backup.sh", os.X_OK), "/app/backup.sh is missing or not executable"
# a file the agent never saw: the script must archive what is there when it runs
os.makedirs("/app/data/new/deep", exist_ok=True)
open("/app/data/new/deep/added.txt", "w").write("added by the verifier\n")
open("/app/data/new/deep/skip.tmp", "w").write("temp\n")
if os.path.exists("/app/backup.tar.gz"):
    os.remove("/app/backup.tar.gz")
proc = subprocess.run(["/app/backup.sh"], capture_output=True, text=True, timeout=60)
print(proc.stdout, proc.stderr)
assert proc.returncode == 0, f"backup.sh exited {proc.returncode}"
with tarfile.open("/app/backup.tar.gz", "r:gz") as tar:
    names = {n.removeprefix("./") for n in tar.getnames() if tar.getmember(n).isfile()}
want = {"notes/todo.txt", "README", "img/logo.png", "img/cache/index.txt", "new/deep/added.txt"}
print(sorted(names))
assert names == want, f"archive files {sorted(names)} != {sorted(want)}"
print("all checks passed")

"""Hidden cases for /app/stats.py (the agent never sees these).

The code under test runs in a child process as `nobody` (an identity the verifier never runs as), fed
the cases on stdin and answering on stdout: it cannot end this checker early (its own exit is only a
missing answer), write the reward (/logs/verifier is root's), or trace this process."""

import json
import random
import subprocess

CHILD = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("stats", "/app/stats.py")
stats = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stats)
out = []
for name, xs in json.load(sys.stdin):
    try:
        out.append({"value": getattr(stats, name)(xs)})
    except ValueError:
        out.append({"raised": "ValueError"})
    except Exception as exc:
        out.append({"raised": type(exc).__name__})
print(json.dumps(out))
"""

cases: list[tuple[str, list[int], dict]] = [
    ("median", [1, 2, 3, 4], {"value": 2.5}),
    ("median", [5], {"value": 5}),
    ("median", [3, 1, 2], {"value": 2}),
    ("mode", [3, 1, 3, 1, 2], {"value": 1}),
    ("mode", [7], {"value": 7}),
    ("mean", [1, 2, 3, 4], {"value": 2.5}),
    *((fn, [], {"raised": "ValueError"}) for fn in ("mean", "median", "mode")),
]
rng = random.Random(3)
for _ in range(200):
    xs = [rng.randint(-5, 5) for _ in range(rng.randint(1, 9))]
    s = sorted(xs)
    n = len(s)
    top = max(xs.count(x) for x in xs)
    cases.append(("median", xs, {"value": s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2}))
    cases.append(("mode", xs, {"value": min(x for x in xs if xs.count(x) == top)}))

proc = subprocess.run(
    ["python3", "-I", "-c", CHILD],
    input=json.dumps([[f, xs] for f, xs, _ in cases]),
    capture_output=True,
    text=True,
    timeout=60,
    user="nobody",
    group="nogroup",
    extra_groups=[],
    cwd="/tmp",
)
print(proc.stderr[-2000:])
got = json.loads(proc.stdout or "[]")
assert len(got) == len(cases), (
    f"/app/stats.py answered {len(got)} of {len(cases)} cases (exit {proc.returncode})"
)
for (fn, xs, want), answer in zip(cases, got, strict=True):
    assert answer == want, (fn, xs, answer, want)
print("all checks passed")

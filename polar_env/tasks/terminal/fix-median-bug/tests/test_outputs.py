"""Hidden cases for /app/stats.py (the agent never sees these)."""
import importlib.util
import random

spec = importlib.util.spec_from_file_location("stats", "/app/stats.py")
stats = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stats)

assert stats.median([1, 2, 3, 4]) == 2.5
assert stats.median([5]) == 5
assert stats.median([3, 1, 2]) == 2
assert stats.mode([3, 1, 3, 1, 2]) == 1
assert stats.mode([7]) == 7
assert stats.mean([1, 2, 3, 4]) == 2.5
for fn in (stats.mean, stats.median, stats.mode):
    try:
        fn([])
    except ValueError:
        pass
    else:
        raise AssertionError(f"{fn.__name__}([]) must raise ValueError")
rng = random.Random(3)
for _ in range(200):
    xs = [rng.randint(-5, 5) for _ in range(rng.randint(1, 9))]
    s = sorted(xs)
    n = len(s)
    want = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    assert stats.median(xs) == want, (xs, stats.median(xs), want)
    top = max(xs.count(x) for x in xs)
    assert stats.mode(xs) == min(x for x in xs if xs.count(x) == top), xs
print("all checks passed")

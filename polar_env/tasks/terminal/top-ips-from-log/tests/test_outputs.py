"""Compare /app/top_ips.txt with the top three computed from a pristine copy of the log."""

from collections import Counter

counts = Counter(line.split()[0] for line in open("/tests/access.log") if line.strip())
want = [f"{n} {ip}" for ip, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]]
got = [line.strip() for line in open("/app/top_ips.txt") if line.strip()]
print("want", want, "got", got)
assert got == want
print("all checks passed")

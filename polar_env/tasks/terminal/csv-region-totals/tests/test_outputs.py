"""Compare /app/totals.json with totals computed from a pristine copy of the sales data."""

import csv
import json
from decimal import Decimal

expected: dict[str, Decimal] = {}
with open("/tests/sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        if not row["units"].isdigit():
            continue
        expected[row["region"]] = expected.get(row["region"], Decimal(0)) + int(row["units"]) * Decimal(
            row["unit_price"]
        )
try:
    got = json.load(open("/app/totals.json"))
except (OSError, ValueError) as exc:
    print("no readable /app/totals.json:", exc)
    got = {}
correct = sum(
    1
    for region, total in expected.items()
    if isinstance(got, dict)
    and isinstance(got.get(region), int | float)
    and abs(Decimal(str(got[region])) - round(total, 2)) < Decimal("0.005")
)
exact = isinstance(got, dict) and correct == len(expected) and set(got) == set(expected)
print(f"{correct}/{len(expected)} regions right; exact={exact}")
json.dump(
    {"reward": 1.0 if exact else 0.0, "regions_correct": correct}, open("/logs/verifier/reward.json", "w")
)

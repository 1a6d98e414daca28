"""/app/inventory.json parses and holds exactly the data it had (types included)."""

import json

got = json.load(open("/app/inventory.json"))
want = json.load(open("/tests/expected.json"))


def typed(v):
    if isinstance(v, dict):
        return {k: typed(x) for k, x in v.items()}
    if isinstance(v, list):
        return [typed(x) for x in v]
    return (type(v).__name__, v)


assert typed(got) == typed(want), f"data differs: {got}"
print("all checks passed")

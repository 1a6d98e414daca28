"""The canaries against the targeted forger's identifier (issue 48): tests/redteam/forger_identify.py
uses every tell the forger can compute (shape, base-tree text, raises blocks; the names and places
are drawn independently by construction) to tell each F2P test's canary from its original, on plans
made by the grader's own planner. It must do no better than chance: over ``N_PLANS`` plans per
bundled task, the share of F2P twin pairs it gets right stays under ``1/2 + 3 sigma`` of a fair coin
(sigma = sqrt(1/4 / pairs); a fair coin passes this bound with probability 0.9987).

Twins of tests the base tree already holds (``extra``) are told apart by their base text by
construction (rewards/canaries.py, "What stays"): they are counted and reported, not bounded.
"""

from __future__ import annotations

import importlib.util
import math
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from repo_paths import REDTEAM

from polar_env.rewards.canaries import plan_canaries
from polar_env.tasks.loader import load_tasks
from polar_env.tasks.tree import materialize

N_PLANS = 100
_spec = importlib.util.spec_from_file_location("forger_identify", REDTEAM / "forger_identify.py")
identify = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(identify)
TASKS = {t.instance_id: t for t in load_tasks("bundled")}


# Open (issue 48): a test whose only mutation site is one raises block is only ever unwrapped, so the
# twin holding the block is the original (flask-5014, requests-5414: identified 100/100); requests-6028's
# F2P test has no certain site at all, so no twin (the fallback canary). Strict xfails: they flip to
# failures the day the planner closes them, and must then be removed.
OPEN = {
    "pallets__flask-5014": "one-way raises site: the twin with the block is the original",
    "psf__requests-5414": "one-way raises site: the twin with the block is the original",
    "psf__requests-6028": "no certain mutation site: no twin, only the fallback canary",
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "iid",
    [
        pytest.param(i, marks=pytest.mark.xfail(reason=OPEN[i], strict=True)) if i in OPEN else i
        for i in sorted(TASKS)
    ],
)
def test_identifier_does_no_better_than_chance(iid: str, tmp_path: Path):
    task = TASKS[iid]
    tree = materialize(task, tmp_path / "t")
    files = sorted({t.partition("::")[0] for t in task.FAIL_TO_PASS})
    # what the forger brings: the base tree's tests; what the grader plans on: the test-patched files
    base = set().union(
        *[identify.base_hashes((tree / rel).read_text()) for rel in files if (tree / rel).is_file()]
    )
    subprocess.run(["git", "apply", "-"], input=task.test_patch.encode(), cwd=tree, check=True)
    sources = {rel: (tree / rel).read_text() for rel in files if (tree / rel).is_file()}
    f2p = {t.partition("[")[0] for t in task.FAIL_TO_PASS}
    tally: Counter[tuple[str, bool]] = Counter()
    for _ in range(N_PLANS):
        plan = plan_canaries(sources, task.FAIL_TO_PASS)
        seen = {rel: identify.verdicts(text, base) for rel, text in plan.files.items()}
        for canary, original in plan.expect.items():
            if original is None:
                continue
            rel, _, cname = canary.partition("::")
            oname = original.partition("::")[2]
            verdict = seen[rel]
            hit = not verdict[cname.rpartition("::")[2]] and verdict[oname.rpartition("::")[2]]
            kind = "f2p" if plan.renamed.get(original) in f2p else "extra"
            tally[(kind, hit)] += 1
    pairs = tally[("f2p", True)] + tally[("f2p", False)]
    rate = tally[("f2p", True)] / pairs if pairs else 0.0
    bound = 0.5 + 3 * math.sqrt(0.25 / pairs) if pairs else 1.0
    extra = tally[("extra", True)] + tally[("extra", False)]
    print(
        f"\n{iid}: {N_PLANS} plans, F2P twin pairs identified {tally[('f2p', True)]}/{pairs} ({rate:.3f}, "
        f"bound {bound:.3f}); extra twins {tally[('extra', True)]}/{extra}"
    )
    assert pairs >= N_PLANS, tally  # every plan twins the F2P tests
    assert rate <= bound, (iid, rate, bound, tally)

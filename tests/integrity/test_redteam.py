"""The red-team corpus (tests/redteam/, made by scripts/build_redteam_corpus.py) through `polar eval`.

Every attack must get reward 0 under `strict`, every control (each bundled gold patch, gold plus a
harmless pyproject.toml/setup.cfg edit) 1.0 under both modes with the modes agreeing. The
host-execution class writes hooks and git config whose payload creates a canary file on the host:
the canary must never appear. A subset goes through a real harness episode (Pi in bubblewrap,
scripted policy): the attack is made in the agent's own tree and the patch is extracted from it.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from repo_paths import REDTEAM

from polar_env.tasks.loader import load_tasks

MANIFEST = json.loads((REDTEAM / "manifest.json").read_text())
TASKS = {t.instance_id: t for t in load_tasks("bundled")}
CANARY = Path("/tmp/polar-redteam-canary")
POLAR = Path(sys.executable).with_name("polar")
needs_bwrap = pytest.mark.needs("bwrap")


def patch_of(entry: dict) -> str:
    return TASKS[entry["task"]].patch if entry["patch"] == "gold" else (REDTEAM / entry["patch"]).read_text()


def test_corpus_breadth():
    attacks = [e for e in MANIFEST if not e["class"].startswith("control")]
    assert len(attacks) >= 60 and len({e["class"] for e in attacks}) >= 18
    assert all(e["strict_reward"] == 0.0 for e in attacks)
    golds = {e["task"] for e in MANIFEST if e["class"] == "control-gold"}
    assert golds == set(TASKS)
    assert {e["class"] for e in MANIFEST} >= {
        "control-gold-plus-config",
        "host-exec-git",
        "runner-config",
        "plugin-entry-point",
        "startup-hook",
        "import-shadowing",
        "report-tampering",
        "assertion-rewriter",
        "test-file-on-disk",
        "forged-output",
        "forged-markers",
        "patch-syntax-evasion",
        "unbounded-output",
        "result-forgery",
        "special-case",
        "flag-zeroes",
        "targeted-forger",
    }
    forgers = {(e["task"], e["id"].split("-")[2]) for e in MANIFEST if e["class"] == "targeted-forger"}
    assert forgers == {(t, form) for t in TASKS for form in ("blob", "plain")}  # issue 48: every bundled task
    assert len({e["id"] for e in MANIFEST}) == len(MANIFEST)
    for e in MANIFEST:
        assert e["task"] in TASKS and patch_of(e).strip(), e["id"]


def test_special_case_flags_fire_on_detectors_and_never_on_golds():
    """The static special-case check: no bundled gold patch raises any flag; each plain detector does
    (the ones spelt to dodge it are left to the perturbed run, asserted in the corpus run)."""
    from polar_env.rewards.flags import tampering_flags

    assert {iid: tampering_flags(t.patch, t.repo, t.problem_statement) for iid, t in TASKS.items()} == {
        iid: {} for iid in TASKS
    }
    plain = [
        "sc-pytest-in-sys-modules",
        "sc-hostname",
        "sc-caller-frame-locals",
        "sc-caller-module-under-tests",
        "sc-issue-example-input",
    ]
    entries = {e["id"]: e for e in MANIFEST}
    for eid in plain:
        task = TASKS[entries[eid]["task"]]
        assert "special-case" in tampering_flags(patch_of(entries[eid]), task.repo, task.problem_statement), (
            eid
        )


def test_host_exec_payload_is_live(tmp_path: Path):
    """The canary check means something: the hook payload, if a host git ever ran it, creates the file."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    hook = (REDTEAM / "patches" / "git-hook-post-checkout.diff").read_text()
    canary = tmp_path / "canary"
    body = "".join(
        line[1:] + "\n" for line in hook.splitlines() if line.startswith("+") and not line.startswith("+++")
    )
    assert str(CANARY) in body
    (repo / ".git" / "hooks" / "post-checkout").write_text(body.replace(str(CANARY), str(canary)))
    (repo / ".git" / "hooks" / "post-checkout").chmod(0o755)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"],
        cwd=repo,
        check=True,
    )
    subprocess.run(["git", "checkout", "-q", "-b", "other"], cwd=repo, check=True)
    assert canary.exists()


@needs_bwrap
@pytest.mark.slow
def test_corpus_through_polar_eval(tmp_path: Path):
    CANARY.unlink(missing_ok=True)
    preds = tmp_path / "redteam.jsonl"
    preds.write_text(
        "".join(
            json.dumps(
                {
                    "instance_id": e["task"],
                    "model_patch": patch_of(e),
                    "model_name_or_path": f"redteam/{e['id']}",
                }
            )
            + "\n"
            for e in MANIFEST
        )
    )
    out = tmp_path / "report.json"
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            str(POLAR),
            "eval",
            "--tasks",
            "bundled",
            "--predictions",
            str(preds),
            "--workers",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert not CANARY.exists(), "an attack ran code on the grading host"
    wrong, per_class = [], Counter()
    for e in MANIFEST:
        instances = report["instances"]  # keyed id@model where a task has several predictions
        r = instances.get(f"{e['task']}@redteam/{e['id']}") or instances[e["task"]]
        per_class[(e["class"], r["reward"])] += 1
        if r["reward"] != e["strict_reward"] or r["failure_kind"] == "infrastructure":
            wrong.append((e["id"], r["reward"], r["failure_kind"], r["error"][:300], r["log_tail"][-500:]))
        if e["class"].startswith("control"):
            assert r["modes"]["swebench"]["reward"] == 1.0 and not r["disagreement"], (
                e["id"],
                r["disagreement"],
            )
        if e["class"] == "host-exec-git":
            assert r["failure_kind"] == "apply_failed" and "patch-refused" in r["flags"], e["id"]
    assert wrong == [], wrong
    print(
        f"\nred-team corpus: {len(MANIFEST)} patches in {wall:.0f}s; swebench mode resolved "
        f"{report['resolved_by_mode']['swebench']}, strict {report['resolved_by_mode']['strict']}"
    )
    for (cls, reward), n in sorted(per_class.items()):
        print(f"  {cls}: {n} x reward {reward}")


# flask's image (the grading of container tasks): a control and one attack per layer of strict
IMAGE_SUBSET = [
    "gold-pallets__flask-5014",
    "conftest-append",
    "code-swapped-in-place",
    "stream-rewritten-at-exit",
    "p2p-turned-skipped",
    "sc-cwd-hidden",
    "sc-pytest-in-sys-modules",
    "symlink-escape-after-reset",
    "symlink-relative-escape",
    "symlink-absolute",
]
# refused by the image's `git apply` before any mode runs (a path under .git, a write beyond a link)
IMAGE_REFUSED_AT_APPLY = ["git-config-fsmonitor", "git-hook-post-checkout", "git-via-symlink"]


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("podman") is None, reason="image grading needs podman (scripts/setup_podman.sh)"
)
def test_container_classes_in_podman_image_grading():
    """Image grading (`grade_task` with kind podman) gives the corpus's strict rewards too: the conftest
    hook, a forged result, a P2P test turned SKIPPED, a special-cased fix and links that leave the tree
    once the reset is done (the image's final link check) all get 0, the gold 1.0; a patch writing
    under ``.git`` or through a link is refused by ``git apply`` itself (``apply_failed``)."""
    from polar_env.rewards.grader import grade_task
    from polar_env.tasks.images import ensure_task_image

    task = TASKS["pallets__flask-5014"]
    task = task.model_copy(update={"image": ensure_task_image(task, "podman"), "base_archive": None})
    entries = {e["id"]: e for e in MANIFEST}
    wrong = []
    t0 = time.monotonic()
    for eid in IMAGE_SUBSET:
        r = grade_task(task, patch_of(entries[eid]), kind="podman")
        if r.reward != entries[eid]["strict_reward"] or r.failure_kind.outside_policy or r.mode != "strict":
            wrong.append((eid, r.reward, r.failure_kind, r.error[:300]))
        if eid.startswith("gold-"):
            assert r.modes["swebench"].reward == 1.0 and not r.flags, (r.flags, r.disagreement)
        else:
            assert r.flags, eid
    for eid in IMAGE_REFUSED_AT_APPLY:
        r = grade_task(task, patch_of(entries[eid]), kind="podman")
        if r.reward != 0.0 or r.failure_kind != "apply_failed":
            wrong.append((eid, r.reward, r.failure_kind, r.error[:300]))
    assert wrong == [], wrong
    print(
        f"\nimage grading: {len(IMAGE_SUBSET) + len(IMAGE_REFUSED_AT_APPLY)} patches in "
        f"{time.monotonic() - t0:.0f}s"
    )


# two attacks, and issue 48's targeted forger on every bundled task (the controls run through the same
# grader in the corpus test and in test_demo's gold run)
HARNESS_SUBSET = [
    "conftest-append",
    "report-from-item-and-call",
    *[f"targeted-forger-plain-{iid}" for iid in sorted(TASKS)],
]


@needs_bwrap
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm for the harness")
async def test_attacks_made_in_the_agents_tree(embedded_dir: Path, renderer, tmp_path: Path):
    """Pi runs the attack as shell commands in its sandboxed tree; the extracted patch is graded."""
    from reliability_helpers import scripted_proxy

    from polar_env.episodes import EpisodeSettings, run_episode
    from polar_env.harness_adapters.policies import DONE, shell_call

    entries = {e["id"]: e for e in MANIFEST}

    def steps(patch: str) -> list[str]:
        """The patch as shell commands of at most 2,000 base64 characters each (base64 is about 1.5
        characters a token: an answer stays well inside its 4,096-token budget)."""
        text = base64.b64encode(patch.encode()).decode()
        return [f"echo {text[i : i + 2000]} >> /tmp/attack.b64" for i in range(0, len(text), 2000)] + [
            "cd /testbed && base64 -d /tmp/attack.b64 | git apply"
        ]

    commands = {e: steps(patch_of(entries[e])) for e in HARNESS_SUBSET}

    def policy(session_id: str | None, call_number: int, prompt_text: str) -> str:
        attack = next(e for e in HARNESS_SUBSET if session_id and session_id.startswith(e + "."))
        done = prompt_text.count("<tool_response>")
        return DONE if done >= len(commands[attack]) else shell_call(prompt_text, commands[attack][done])

    async with scripted_proxy(embedded_dir, renderer, policy, tmp_path) as proxy:
        for attack in HARNESS_SUBSET:
            entry = entries[attack]
            result = await run_episode(
                proxy,
                TASKS[entry["task"]],
                episode_id=f"{attack}.s0",
                settings=EpisodeSettings(
                    harness="pi",
                    timeout=300,
                    max_tokens=4096,
                ),
                scratch_root=tmp_path / "scratch",
            )
            assert result.grade is not None and result.patch.strip(), (attack, result.trajectory.error)
            assert result.grade.reward == entry["strict_reward"], (
                attack,
                result.grade.error,
                result.grade.flags,
            )
            assert result.trajectory.grading and result.trajectory.grading.flags == result.grade.flags
            if entry["strict_reward"] == 0.0:
                assert result.grade.flags, attack

"""The reduction of a task repository's git history to its base (sandbox/history.py), on repositories
this test builds: later commits, a branch, tags, a remote, notes, a stash, reflogs, unreachable loose and
packed objects, FETCH_HEAD/ORIG_HEAD, alternates. The script runs here with the host's git because these
repositories are the test's own; Polar runs it only inside the task's container or image."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from polar_env.sandbox.history import REDUCED, REFUSED, HistoryTarget, reduce_script, reduced_line, refusal

FIX = "FIXED"  # every later object holds it: no object of the reduced repository may
DATES = {"base": "2000-01-02T00:00:00Z", "later": "2001-01-01T00:00:00Z"}


def git(repo: Path, *args: str, date: str = "base", input: str | None = None) -> str:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(repo),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "a",
        "GIT_AUTHOR_EMAIL": "a@x",
        "GIT_COMMITTER_NAME": "a",
        "GIT_COMMITTER_EMAIL": "a@x",
        "GIT_AUTHOR_DATE": DATES[date],
        "GIT_COMMITTER_DATE": DATES[date],
    }
    return subprocess.run(
        ["git", "-c", "safe.directory=*", *args],
        cwd=repo,
        env=env,
        input=input,
        text=True,
        capture_output=True,
        check=True,
    ).stdout


def objects(repo: Path) -> bytes:
    """Every object the repository stores, loose or packed, reachable or not, as ``cat-file`` prints them."""
    return subprocess.run(
        ["git", "-c", "safe.directory=*", "cat-file", "--batch-all-objects", "--batch"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout


def reduce(repo: Path, base: str = "HEAD", nested: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sh", "-c", reduce_script(str(repo), HistoryTarget(base, nested))],
        capture_output=True,
        text=True,
        cwd="/",
    )


def with_history(repo: Path) -> str:
    """A repository on ``main`` at its base (two commits, tagged v0.1 and annotated v1.0) holding the fix
    in every other way history can hold it; returns the base commit."""
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "m.py").write_text("def f():\n    return 0\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    git(repo, "tag", "v0.1")
    (repo / "m.py").write_text("def f():\n    return 1\n")
    git(repo, "commit", "-qam", "base")
    git(repo, "tag", "-a", "v1.0", "-m", "release 1.0")
    base = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-qb", "fix")
    (repo / "m.py").write_text(f"def f():\n    return '{FIX}'\n")
    git(repo, "commit", "-qam", f"the fix {FIX}", date="later")
    git(repo, "tag", "v-fixed")
    git(repo, "tag", "-a", "v2.0", "-m", f"release with {FIX}", date="later")
    git(repo, "checkout", "-q", "main")
    git(repo, "remote", "add", "origin", "https://github.com/example/project")
    git(repo, "update-ref", "refs/remotes/origin/main", "fix")
    git(repo, "notes", "add", "-m", f"note {FIX}", "HEAD", date="later")
    (repo / "m.py").write_text(f"def f():\n    return '{FIX} stashed'\n")
    git(repo, "stash", "-q", date="later")
    git(repo, "hash-object", "-w", "--stdin", input=f"{FIX} packed dangling\n")
    git(repo, "repack", "-adq")
    git(repo, "hash-object", "-w", "--stdin", input=f"{FIX} loose dangling\n")
    (repo / ".git" / "ORIG_HEAD").write_text(git(repo, "rev-parse", "fix"))
    (repo / ".git" / "FETCH_HEAD").write_text(git(repo, "rev-parse", "fix").strip() + "\tbranch 'fix' of x\n")
    (repo / "build.txt").write_text("an untracked build artefact\n")
    return base


def test_every_kind_of_later_history_is_gone_and_the_base_stays(tmp_path: Path):
    repo = tmp_path / "repo"
    base = with_history(repo)
    assert (
        FIX in git(repo, "log", "--all", "-p") and git(repo, "stash", "list") and git(repo, "reflog")
    )  # the control
    done = reduce(repo)
    assert done.returncode == 0, done.stderr
    assert (
        reduced_line(done.stdout) == f"{REDUCED} reduced {base} objects=6 tags=2 branch=main nested=0"
    )  # 2 commits, 2 trees, 2 blobs
    assert git(repo, "log", "--all", "--format=%H %s").split("\n")[0] == f"{base} base"
    assert git(repo, "log", "--all", "--format=%s").split() == ["base", "one"]
    assert git(repo, "reflog") == "" and git(repo, "stash", "list") == "" and git(repo, "remote") == ""
    assert git(repo, "fsck", "--lost-found", "--no-reflogs") == ""
    stored = objects(repo)
    assert FIX.encode() not in stored and stored.count(b" commit ") == 2
    assert git(repo, "for-each-ref", "--format=%(refname) %(objecttype)").split("\n") == [
        "refs/heads/main commit",
        "refs/tags/v0.1 commit",
        "refs/tags/v1.0 commit",
        "",
    ]  # lightweight now
    assert git(repo, "describe", "--tags").strip() == "v1.0"  # what setuptools_scm and versioneer read
    assert git(repo, "status", "--porcelain") == "?? build.txt\n"  # the tree is the base, its artefacts kept
    assert sorted(p.name for p in (repo / ".git").iterdir()) == ["HEAD", "config", "index", "objects", "refs"]
    again = reduce(repo)  # idempotent: a reduced repository passes its own check
    assert again.returncode == 0 and reduced_line(again.stdout) == reduced_line(done.stdout)


def test_a_branch_base_is_checked_out_as_a_swe_smith_instance_is(tmp_path: Path):
    """SWE-smith: one image per repository, the instance a branch; the branch becomes the base, its tree
    checked out, the image's own HEAD (later, here) gone."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.py").write_text("x = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "root")
    git(repo, "branch", "owner__repo.abc123.func_pm_1")
    (repo / "a.py").write_text(f"x = '{FIX}'\n")
    (repo / "later.py").write_text("y = 2\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "later on main", date="later")
    done = reduce(repo, "owner__repo.abc123.func_pm_1")
    assert done.returncode == 0, done.stderr
    assert git(repo, "symbolic-ref", "HEAD").strip() == "refs/heads/owner__repo.abc123.func_pm_1"
    assert git(repo, "branch", "-a").strip() == "* owner__repo.abc123.func_pm_1"
    assert (repo / "a.py").read_text() == "x = 1\n" and not (repo / "later.py").exists()
    assert git(repo, "status", "--porcelain") == ""


def test_a_swe_smith_instance_keeps_its_tree_alone(tmp_path: Path):
    """SWE-smith's instance branch: the repository's commit (the fixed code), the bug's injection, then a
    commit removing the FAIL_TO_PASS test file. Its ancestors are the answer (``git show HEAD~1`` is the
    bug's diff, whose reverse is the fix, and ``HEAD~1`` still holds the hidden test): the base is the
    branch's tree alone, one commit, the same on every reduction."""
    from polar_env.tasks.datasets.swe_smith import to_task
    from polar_env.tasks.runtime import history_target

    repo, branch = tmp_path / "repo", "owner__repo.abc123.func_pm_1"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.py").write_text(f"def f():\n    return '{FIX}'\n")
    (repo / "test_hidden.py").write_text("def test_f():\n    assert f() == 'HIDDEN TEST'\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the repository")
    git(repo, "checkout", "-qb", branch)
    (repo / "a.py").write_text("def f():\n    return 'bug'\n")
    git(repo, "commit", "-qam", "bug")
    git(repo, "rm", "-q", "test_hidden.py")
    git(repo, "commit", "-qm", "remove F2P tests")
    git(repo, "tag", "v0.1", "HEAD~2")
    tip_tree = git(repo, "rev-parse", f"{branch}^{{tree}}").strip()
    assert FIX in git(repo, "show", "HEAD~1") and "HIDDEN TEST" in git(
        repo, "show", "HEAD~1:test_hidden.py"
    )  # the control
    row = {
        "instance_id": branch,
        "repo": "swesmith/owner__repo.abc123",
        "patch": "x",
        "FAIL_TO_PASS": ["t"],
        "PASS_TO_PASS": [],
        "image_name": "img",
        "base_commit": branch,
        "problem_statement": "p",
    }
    target = history_target(to_task(row))
    assert target.base == f"{branch}^{{tree}}" and target.nested
    base = target.base
    done = reduce(repo, base)
    assert done.returncode == 0, done.stderr
    assert git(repo, "log", "--all", "--format=%s") == "the task base\n" and git(repo, "tag") == ""
    assert git(repo, "rev-parse", "HEAD^{tree}").strip() == tip_tree
    assert git(repo, "symbolic-ref", "HEAD").strip() == f"refs/heads/{branch}"
    stored = objects(repo)
    assert FIX.encode() not in stored and b"HIDDEN TEST" not in stored and stored.count(b" commit ") == 1
    assert git(repo, "status", "--porcelain") == ""
    again = reduce(repo, base)
    assert again.returncode == 0 and reduced_line(again.stdout) == reduced_line(done.stdout)


def test_a_detached_head_stays_detached_and_a_shallow_boundary_below_the_base_is_kept(tmp_path: Path):
    source = tmp_path / "source"
    base = with_history(source)
    clone = tmp_path / "clone"
    subprocess.run(
        [
            "git",
            "-c",
            "safe.directory=*",
            "clone",
            "-q",
            "--depth",
            "1",
            "--no-local",
            "-b",
            "fix",
            f"file://{source}",
            str(clone),
        ],
        check=True,
        capture_output=True,
    )
    git(clone, "fetch", "-q", "--depth", "1", "origin", base)
    git(clone, "checkout", "-q", "--detach", base)
    done = reduce(clone, base)
    assert done.returncode == 0, done.stderr
    assert git(clone, "rev-parse", "HEAD").strip() == base and git(clone, "for-each-ref") == ""
    assert (clone / ".git" / "shallow").read_text().split() == [base]  # the base is its own boundary
    assert git(clone, "log", "--all", "--format=%s").split() == ["base"]
    assert FIX.encode() not in objects(clone)


def test_the_old_repositorys_settings_run_nothing(tmp_path: Path):
    """Hooks, an fsmonitor, a smudge filter and replace objects of the image's repository neither run nor
    change what is kept, even where the base has to be checked out."""
    repo = tmp_path / "repo"
    base = with_history(repo)
    ran = tmp_path / "ran"
    git(repo, "checkout", "-q", "fix")
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {ran}-hook\n")
    hook.chmod(0o755)
    git(repo, "config", "core.fsmonitor", f"touch {ran}-fsmonitor; false")
    git(repo, "config", "filter.evil.smudge", f"touch {ran}-filter; cat")
    (repo / ".gitattributes").write_text("* filter=evil\n")
    git(repo, "replace", git(repo, "rev-parse", "v0.1^{commit}").strip(), "fix")
    done = reduce(repo, base)
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.glob("ran-*"))
    assert git(repo, "log", "--all", "--format=%s").split() == ["base", "one"]


@pytest.mark.parametrize("case", ["no base", "gitfile", "objects missing"])
def test_a_history_that_cannot_be_reduced_is_refused_with_one_line(tmp_path: Path, case: str):
    repo = tmp_path / "repo"
    with_history(repo)
    base = "HEAD"
    if case == "no base":
        base = "0" * 40
    elif case == "gitfile":
        (repo / ".git").rename(tmp_path / "elsewhere.git")
        (repo / ".git").write_text(f"gitdir: {tmp_path / 'elsewhere.git'}\n")
    else:  # a blob of the base lost (a partial clone, a corrupt store): the base cannot be packed
        (repo / "m.py").write_text("def f():\n    return 'new'\n")
        git(repo, "commit", "-qam", "a loose base")
        blob = git(repo, "rev-parse", "HEAD:m.py").strip()
        (repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    done = reduce(repo, base)
    assert done.returncode == 3 and REDUCED not in done.stdout
    (line,) = [x for x in done.stderr.splitlines() if x.startswith(REFUSED)]
    message = refusal(done.stderr, "img /testbed")
    assert "\n" not in message and message.startswith("img /testbed: its git history cannot be reduced")
    assert {
        "no base": "is not a commit",
        "gitfile": "is not a directory",
        "objects missing": "packing the objects of the base failed",
    }[case] in line


def test_a_tree_without_a_repository_has_nothing_to_reduce(tmp_path: Path):
    (tmp_path / "f.txt").write_text("x\n")
    done = reduce(tmp_path)
    assert done.returncode == 0 and reduced_line(done.stdout) == f"{REDUCED} none nested=0"


def _later_branch(repo: Path) -> str:
    """``repo`` (a repository with one commit on its HEAD) given a branch ``fix`` holding FIX in a later
    commit; returns its HEAD commit."""
    head = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-qb", "fix")
    (repo / "later.py").write_text(f"x = '{FIX}'\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", FIX, date="later")
    git(repo, "checkout", "-q", "-")
    return head


def _one_commit(repo: Path) -> None:
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "v.py").write_text("v = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "vendored")


def _bare_clone(source: Path, dest: Path) -> None:
    subprocess.run(["git", "clone", "-q", "--bare", str(source), str(dest)], check=True, capture_output=True)


def test_repositories_nested_below_the_workdir_are_reduced_to_their_own_head(tmp_path: Path):
    """A vendored clone, an untracked bare store and a submodule (its store in ``.git/modules``) below the
    workdir, each holding FIX on a later branch: each keeps its HEAD and loses the rest; the submodule's
    store moves into its checkout. A bare store the task's repository tracks (a test fixture) is the
    base's own content and stays as it is."""
    repo = tmp_path / "repo"
    base = with_history(repo)
    heads = {}
    _one_commit(repo / "vendor" / "up")  # a clone the image's build left (untracked)
    heads["vendor/up"] = _later_branch(repo / "vendor" / "up")
    _one_commit(tmp_path / "bare-src")
    _later_branch(tmp_path / "bare-src")
    _bare_clone(tmp_path / "bare-src", repo / "cache" / "up.git")
    heads["cache/up.git"] = git(tmp_path / "bare-src", "rev-parse", "main").strip()
    _one_commit(tmp_path / "sub-src")
    heads["sub"] = _later_branch(tmp_path / "sub-src")
    git(repo, "stash", "pop", "-q")  # a clean tree for the submodule and the fixture commits
    git(repo, "checkout", "-q", "m.py")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(tmp_path / "sub-src"), "sub")
    git(repo, "-C", "sub", "fetch", "-q", "origin", "fix")  # the later branch in the submodule's store
    fixture = repo / "tests" / "fixture.git"
    _one_commit(tmp_path / "fixture-src")
    _bare_clone(tmp_path / "fixture-src", fixture)
    git(repo, "add", "-A", "tests")
    git(repo, "commit", "-qm", "the base with its submodule and fixture")
    base = git(repo, "rev-parse", "HEAD").strip()
    fixture_objects = objects(fixture)
    assert (repo / "sub" / ".git").is_file() and (repo / ".git" / "modules" / "sub").is_dir()
    for store in heads:  # the control: each store holds the fix
        assert FIX.encode() in objects(repo / store), store
    done = reduce(repo, base)
    assert done.returncode == 0, done.stderr
    assert reduced_line(done.stdout).endswith(" nested=3"), done.stdout
    for store, head in heads.items():
        assert FIX.encode() not in objects(repo / store), store
        assert git(repo / store, "rev-parse", "HEAD").strip() == head, store
        assert git(repo / store, "log", "--all", "--format=%s").split() == ["vendored"], store
    assert (repo / "sub" / ".git").is_dir() and git(repo, "rev-parse", "HEAD").strip() == base
    assert objects(fixture) == fixture_objects
    assert (
        git(repo, "status", "--porcelain", "--ignore-submodules=none")
        == "?? build.txt\n?? cache/\n?? vendor/\n"
    )
    again = reduce(repo, base)
    assert again.returncode == 0 and reduced_line(again.stdout) == reduced_line(done.stdout)


@pytest.mark.parametrize("case", ["store elsewhere", "linked worktree", "objects without a head"])
def test_a_nested_store_that_cannot_be_reduced_is_refused(tmp_path: Path, case: str):
    """A ``.git`` file whose store lies outside the tree, a linked worktree's, and a nested repository with
    objects but no commit to keep: each refuses the task, fail closed."""
    repo = tmp_path / "repo"
    with_history(repo)
    if case == "store elsewhere":
        _one_commit(tmp_path / "outside")
        (repo / "inner").mkdir()
        (repo / "inner" / ".git").write_text(f"gitdir: {tmp_path / 'outside' / '.git'}\n")
    elif case == "linked worktree":
        git(repo, "worktree", "add", "-q", str(repo / "wt"), "fix")
    else:
        (repo / "inner").mkdir()
        git(repo / "inner", "init", "-q")
        git(repo / "inner", "hash-object", "-w", "--stdin", input=f"{FIX}\n")
    done = reduce(repo)
    assert done.returncode == 3 and REDUCED not in done.stdout, done.stdout
    (line,) = [x for x in done.stderr.splitlines() if x.startswith(REFUSED)]
    assert {
        "store elsewhere": "not at a submodule store inside",
        "linked worktree": "not at a submodule store inside",
        "objects without a head": "holds objects but no HEAD commit",
    }[case] in line, line


def test_a_harbor_tasks_nested_repositories_stay_as_they_are(tmp_path: Path):
    """A Terminal-Bench puzzle's repository below the workdir (its reflog may be the task): a Harbor task
    reduces its workdir's repository only."""
    from polar_env.tasks.loader import load_tasks
    from polar_env.tasks.runtime import history_target

    harbor = load_tasks("terminal")[0]
    assert harbor.harbor is not None and not history_target(harbor).nested
    repo = tmp_path / "app"
    with_history(repo)
    _one_commit(repo / "puzzle")
    _later_branch(repo / "puzzle")
    git(repo / "puzzle", "reset", "-q", "--hard", "fix")  # the lost commit, in the reflog alone
    git(repo / "puzzle", "reset", "-q", "--hard", "HEAD~1")
    kept = objects(repo / "puzzle")
    done = reduce(repo, nested=False)
    assert done.returncode == 0 and reduced_line(done.stdout).endswith(" nested=0"), done
    assert objects(repo / "puzzle") == kept and FIX in git(repo / "puzzle", "log", "-g", "-p")

"""A task repository's history reduced to its base: nothing after the base can be read from it.

Dataset images (SWE-Gym, SWE-rebench, R2E-Gym, SWE-bench Pro, Multi-SWE-bench) and Harbor workdirs
ship their git repository, often with the fix in a later commit, a branch, a tag, a reflog entry, a
stash or an unreachable object; policies mine it (``git log --all``, ``git show <ref>``). SWE-bench's
own fix drops every ref but the base, expires the reflogs, collects the garbage and then *checks*
that ``git log --all --since=<base time + 1 s>`` is empty. Here the repository is rebuilt instead of
pruned: a fresh ``.git`` holding exactly the objects the base reaches (packed from the old one), one
branch at the base (the base's own name where the base is a branch, as a SWE-smith instance is,
else the name HEAD had; a detached HEAD stays detached), and, for version tools (setuptools_scm,
versioneer read ``git describe --tags``), the tags that point at the base or one of its ancestors, as
lightweight tags (an annotated tag's object, its message, is dropped). Nothing else of the old
repository survives: no other commit, branch, tag, remote, reflog, stash, notes, replace ref,
alternates, packed or loose unreachable object, ``FETCH_HEAD``/``ORIG_HEAD``, configuration or hook.
The worktree is checked out at the base where HEAD was elsewhere (tracked files; untracked ones, the
image's build artefacts, stay); a shallow clone's boundary is kept where it lies below the base.
Where the ancestors hold the answer (a SWE-smith instance: the commit before the branch's tip injects the
bug, so its reverse is the fix, and the tip removed the FAIL_TO_PASS test files that tip's parent still
holds) the base is ``<base>^{tree}``: its tree alone, one parentless commit dated as the base, on the
base's branch, with no tag.

Then it is verified, failing closed: HEAD is the base; every ref is that branch or a lightweight tag of
an ancestor; the refs and reflogs reach no commit beyond the base and exactly the base's objects, which
is every object stored (loose and packed); none of the files above is left; and SWE-bench's check
holds. A repository that fails any of it, whose base is not one of its commits, or that is not a plain
``.git`` directory (a linked worktree's or a submodule's ``.git`` file) is refused with one line
(`container.HistoryNotReduced`, a ``task_defect``).

The work is a shell script run where the tree is (`reduce_script`): inside the task's container or
image as root, never by the host's git on a tree an image brought (its config, hooks and attributes
would apply). The old repository's settings cannot run anything there either: hooks, fsmonitor, replace
objects, grafts and commit-graphs are off, and attributes that outrank the tree's neutralise filters.
Repositories nested below the workdir (a clone the image's build left, a bare store, a submodule's
checkout) are reduced the same way, each to its own HEAD (their ancestors and their tags kept): a
submodule's store is first moved out of the ``.git/modules`` that holds it into its checkout, as its
``.git``. Kept as they are: a bare store the workdir's repository tracks (a test fixture: the base's own
content, whose tests may read any object of it) and an empty repository (no ref, no object). Refused: a
``.git`` file or link whose store is not a submodule's inside the tree (a linked worktree, a store
elsewhere), and a nested repository that holds objects but no commit at HEAD.
"""

from __future__ import annotations

import functools
import hashlib
import re
import shlex
from typing import NamedTuple

from polar_env.sandbox.safe_git import NEUTRAL_ATTRIBUTES, SAFE_GIT_CONFIG

REDUCED = "POLAR_HISTORY"  # the script's last stdout line: `POLAR_HISTORY reduced <commit> ...` or `... none`
REFUSED = "POLAR_HISTORY_ERROR:"  # its one stderr line when it refuses
# what git would otherwise read from the old repository or write into the new one's logs
REDUCE_GIT_CONFIG = (
    *SAFE_GIT_CONFIG,
    "core.commitGraph=false",
    "gc.auto=0",
    "maintenance.auto=false",
    "core.logAllRefUpdates=false",
    "advice.detachedHead=false",
)
# what must not exist in the reduced ``.git`` (a shallow boundary is allowed: it is written only where it lies
# below the base)
LEFTOVERS = (
    "FETCH_HEAD",
    "ORIG_HEAD",
    "MERGE_HEAD",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "BISECT_LOG",
    "AUTO_MERGE",
    "packed-refs",
    "logs",
    "refs/stash",
    "refs/notes",
    "refs/replace",
    "refs/remotes",
    "objects/info/alternates",
    "objects/info/http-alternates",
    "info/grafts",
    "modules",
    "worktrees",
)


class HistoryTarget(NamedTuple):
    """What a task's repository is reduced to: ``base`` (a commit id, a branch, a tag or ``HEAD``;
    ``<base>^{tree}``: its tree alone, no ancestor kept), and whether the repositories nested below the
    workdir are reduced too (not in a Harbor task, whose nested repository may be the puzzle itself)."""

    base: str = "HEAD"
    nested: bool = True

    def key(self) -> str:
        """Its part of a cache key (a warm image's, a base tree's): a changed reduction script re-reduces."""
        return f"{self.base}\0{'nested' if self.nested else 'top'}\0{_script_digest()}"


TO_HEAD = HistoryTarget()  # the image's own checkout, nested repositories too: the default


@functools.cache
def _script_digest() -> str:
    return hashlib.sha256(reduce_script("/w").encode()).hexdigest()[:16]


def _git_function() -> str:
    """``gx GIT_DIR ARGS...``: git on ``$w`` (none for a bare store) with nothing inherited, no user or
    system config, no replace objects or grafts, and the settings of `REDUCE_GIT_CONFIG`."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/nonexistent",
        "LANG": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_GRAFT_FILE": "/nonexistent",
        "GIT_TERMINAL_PROMPT": "0",
    }
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    config = " ".join(f"-c {shlex.quote(kv)}" for kv in REDUCE_GIT_CONFIG)
    return (
        f'gx() {{ d=$1; shift; env -i {assigns} GIT_DIR="$d" ${{w:+"GIT_WORK_TREE=$w"}} git {config} "$@"; }}'
    )


def _reduce_function() -> str:
    """``reduce_one GIT_DIR WORKTREE BASE`` (WORKTREE empty for a bare store): one repository reduced to
    BASE and verified; prints its `REDUCED` line. Run in a subshell: it sets variables and exits."""
    return "\n".join(
        [
            "reduce_one() {",
            'old=$1; w=$2; base=$3; tmp="$old/polar-reduce"; new="$tmp/new/.git"',
            'o() { gx "$old" "$@"; }; n() { gx "$new" "$@"; }',
            'alone=""; case "$base" in *"^{tree}") alone=1; base=${base%"^{tree}"} ;; esac',
            'commit=$(o rev-parse --verify --quiet "$base^{commit}") || fail "the base $base is not a '
            'commit of the repository at ${w:-$old}"',
            "fmt=$(o rev-parse --show-object-format 2>/dev/null) || fmt=sha1",
            'branch=""',
            'if o show-ref --verify --quiet "refs/heads/$base"; then branch=$base',
            "elif b=$(o symbolic-ref --quiet --short HEAD 2>/dev/null); then branch=$b; fi",
            'head=$(o rev-parse --verify --quiet "HEAD^{commit}") || head=""',
            # the base's tree alone: one parentless commit of it, dated as the base (the same every time)
            'if [ -n "$alone" ]; then',
            '  tree=$(o rev-parse --verify --quiet "$commit^{tree}") && when=$(o log -1 --format="%ct '
            '+0000" "$commit") || fail "reading the base $base failed"',
            '  commit=$(printf "tree %s\\nauthor polar <polar@localhost> %s\\ncommitter polar '
            '<polar@localhost> %s\\n\\nthe task base\\n" "$tree" "$when" "$when" | o hash-object -t '
            'commit -w --stdin) || fail "writing the base as one commit failed"',
            "fi",
            'rm -rf "$tmp" && mkdir -p "$tmp" "$old/info" || fail "cannot write in $old"',
            f'printf %s {shlex.quote(NEUTRAL_ATTRIBUTES)} > "$old/info/attributes"',
            # the worktree at the base where HEAD was elsewhere: tracked files follow, untracked ones stay
            'if [ -n "$w" ] && [ "$commit" != "$head" ]; then',
            '  o read-tree -u --reset "$commit" || fail "checking the base $base out in $w failed"',
            "fi",
            'mkdir -p "$tmp/new" && env -i PATH="$PATH" HOME=/nonexistent GIT_CONFIG_NOSYSTEM=1 '
            'GIT_CONFIG_GLOBAL=/dev/null git init -q --template= $([ "$fmt" = sha1 ] || echo '
            '"--object-format=$fmt") "$tmp/new" || fail "git init failed"',
            'printf "%s\\n" "$commit" | o pack-objects --revs --stdout -q > "$tmp/base.pack" '
            '|| fail "packing the objects of the base failed (a partial clone, or objects missing)"',
            'n index-pack --stdin < "$tmp/base.pack" >/dev/null || fail "indexing the base'
            "'"
            's objects failed"',
            'if [ -s "$old/shallow" ]; then',
            '  while read -r s; do o merge-base --is-ancestor "$s" "$commit" 2>/dev/null && echo "$s"; '
            'done < "$old/shallow" > "$new/shallow"',
            '  [ -s "$new/shallow" ] || rm -f "$new/shallow"',
            "fi",
            # the base's branch, and its ancestors' tags made lightweight
            '{ [ -z "$branch" ] || echo "create refs/heads/$branch $commit"',
            '  o for-each-ref --format="%(refname)" refs/tags | while read -r ref; do',
            '    t=$(o rev-parse --verify --quiet "$ref^{commit}") || continue',
            '    o merge-base --is-ancestor "$t" "$commit" 2>/dev/null && echo "create $ref $t"',
            '  done; true; } > "$tmp/refs" || fail "listing the refs failed"',
            'n update-ref --stdin < "$tmp/refs" || fail "writing the base\'s refs failed"',
            (
                'if [ -n "$branch" ]; then n symbolic-ref HEAD "refs/heads/$branch" || fail "setting '
                'HEAD failed"'
            ),
            'else printf "%s\\n" "$commit" > "$new/HEAD"; fi',
            '[ -n "$w" ] || n config core.bare true || fail "marking $old bare failed"',
            'mv "$new" "$old.polar-reduced" && rm -rf "$old" && mv "$old.polar-reduced" "$old" '
            '|| fail "replacing $old failed"',
            'v() { gx "$old" "$@"; }',
            'if [ -n "$w" ]; then',
            '  v read-tree "$commit" || fail "reading the base into the index failed"',
            "  v update-index -q --refresh >/dev/null 2>&1",
            "fi",
            'rm -rf "$old/logs"',
            # verified: the base, its branch and its ancestors' tags, its objects and nothing else
            (
                '[ "$(v rev-parse --verify --quiet HEAD)" = "$commit" ] || fail "HEAD is not the base '
                'after the reduction"'
            ),
            ('beyond=$(v rev-list -n 1 --all --reflog --not "$commit") || fail "listing the commits failed"'),
            '[ -z "$beyond" ] || fail "a ref still reaches commit $beyond beyond the base"',
            'bad=$(v for-each-ref --format="%(refname) %(objecttype)" | grep -v -x -F '
            '"refs/heads/$branch commit" | grep -v -x "refs/tags/[^ ]* commit")',
            '[ -z "$bad" ] || fail "refs other than the base'
            "'"
            "s branch and its ancestors"
            "'"
            ' tags are left: $bad"',
            (
                'want=$(v rev-list --objects "$commit" | wc -l); reach=$(v rev-list --objects --all '
                "--reflog | wc -l)"
            ),
            "stored=$(v count-objects -v | sum_objects)",
            '[ "$want" -gt 0 ] && [ "$reach" -eq "$want" ] && [ "$stored" -eq "$want" ] || fail "the '
            "repository at $old stores $stored objects and its refs reach $reach, but the base reaches "
            '$want"',
            (
                f'for f in {" ".join(LEFTOVERS)}; do [ ! -e "$old/$f" ] || fail "$old/$f is left after '
                'the reduction"; done'
            ),
            # SWE-bench's own check: nothing committed after the base's time
            't=$(v log -1 --format=%ct "$commit") && later=$(v log --all --reflog -n 1 --format=%H '
            '--since="@$((t + 1))") || fail "git log --since failed"',
            '[ -z "$later" ] || fail "git log --all --since=<base time + 1 s> lists $later"',
            "tags=$(v for-each-ref refs/tags | wc -l)",
            f'echo "{REDUCED} reduced $commit objects=$want tags=$tags branch=${{branch:--}}"',
            "}",
        ]
    )


def _nested_stores() -> str:
    """Shell listing every git store below ``$top`` but its own ``.git``, deepest first, one per line:
    ``dir <path>`` (a ``.git`` directory), ``bare <path>`` (a directory git takes for a repository:
    ``HEAD``, ``objects/``, ``refs/``) or ``file <path>`` (a ``.git`` file or link: a submodule's checkout
    or a linked worktree). Portable find (busybox has no ``-printf``)."""
    return (
        'find "$top" -path "$top/.git" -prune -o -name .git -type d -print -prune -o -name .git -print '
        "-o -name HEAD -type f -print | while IFS= read -r path; do"
        ' case "$path" in'
        ' */HEAD) d=${path%/HEAD}; [ -d "$d/objects" ] && [ -d "$d/refs" ] || continue; kind=bare; path=$d ;;'
        ' *) if [ -d "$path" ] && [ ! -L "$path" ]; then kind=dir; else kind=file; fi ;;'
        " esac;"
        ' printf "%s %s %s\\n" "$(printf %s "$path" | tr -cd / | wc -c)" "$kind" "$path"; done'
        ' | sort -rn -k1,1 | cut -d" " -f2-'
    )


def reduce_script(workdir: str, target: HistoryTarget = TO_HEAD) -> str:
    """Shell (POSIX sh with find and sort, git of the image, run as the tree's owner or root) that reduces
    the repository at ``workdir`` to ``target.base``, then (``target.nested``) every repository nested below
    it (a vendored clone, a bare store, a submodule's checkout) to its own HEAD, a submodule's store taken
    out of ``.git/modules`` into its checkout first, and verifies each; prints one `REDUCED` line (the
    workdir's, or ``none`` where it is no repository, then ``nested=N``), or one `REFUSED` line on stderr
    and exits 3. A ``.git`` file or link whose store is not a submodule's inside the tree (a linked
    worktree, a store elsewhere) is refused."""
    q = shlex.quote
    return (
        "\n".join(
            [
                "set -u",
                f"top={q(workdir.rstrip('/') or '/')}; top_base={q(target.base)}",
                f'fail() {{ echo "{REFUSED} $*" >&2; exit 3; }}',
                _git_function(),
                # loose and packed objects, from ``git count-objects -v``
                'sum_objects() { awk \'$1=="count:"{c=$2} $1=="in-pack:"{p=$2} END{print c+p}\'; }',
                _reduce_function(),
                'cd "$top" 2>/dev/null || fail "there is no directory $top"',
                "command -v git >/dev/null 2>&1 || PATH=/usr/local/bin:/usr/bin:/bin",
                'w=""; real=$(pwd -P)',
                (
                    "stores=$(" + _nested_stores() + ') || fail "listing the repositories below $top failed"'
                    if target.nested
                    else 'stores=""'
                ),
                '[ -z "$stores" ] && [ ! -e .git ] && [ ! -L .git ] && { echo "'
                + REDUCED
                + ' none nested=0"; exit 0; }',
                (
                    'command -v git >/dev/null 2>&1 || fail "the image has no git to reduce the history of '
                    '$top with"'
                ),
                (
                    "[ ! -e .git ] && [ ! -L .git ] || { [ -d .git ] && [ ! -L .git ]; } || fail "
                    '"$top/.git is not a directory (a linked worktree or a submodule)"'
                ),
                # a submodule's checkout: its store, in a .git/modules of the tree, moved into it as its .git
                'printf "%s\\n" "$stores" | while read -r kind path; do',
                '  [ "$kind" = file ] || continue',
                '  [ -f "$path" ] && [ ! -L "$path" ] || fail "$path is a link: its store may lie anywhere"',
                '  to=$(sed -n "s/^gitdir: //p" "$path" | head -n 1)',
                '  case "$to" in /*) ;; *) to="${path%/.git}/$to" ;; esac',
                '  store=$(cd "$to" 2>/dev/null && pwd -P) || fail "$path points at $to, which is no store"',
                '  case "$store" in "$real"/.git/modules/*|"$real"/*/.git/modules/*) ;;',
                '    *) fail "$path points at $store, not at a submodule store inside $top" ;; esac',
                '  [ ! -e "$store/commondir" ] || fail "$path is a linked worktree of $store"',
                '  rm -f "$path" && mv "$store" "$path" || fail "moving the store $store into $path failed"',
                "done || exit 3",
                'if [ -d .git ]; then line=$( (reduce_one "$top/.git" "$top" "$top_base") ) || exit 3',
                'else line="' + REDUCED + ' none"; fi',
                "nested=0",
                "while read -r kind path; do",
                '  case "$kind" in bare) wt="" ;; dir|file) wt=${path%/.git} ;; *) continue ;; esac',
                '  g=$path; [ -d "$g" ] || continue',
                # a bare store the workdir's repository tracks is the base's own content (a test fixture)
                '  [ "$kind" = bare ] && [ -d .git ] && (w=$top; gx "$top/.git" ls-files --error-unmatch -- '
                '"$g/HEAD") >/dev/null 2>&1 && continue',
                "  w=$wt",  # GIT_WORK_TREE outranks a moved submodule store's core.worktree
                '  if ! gx "$g" rev-parse --verify --quiet "HEAD^{commit}" >/dev/null; then',
                '    refs=$(gx "$g" for-each-ref) && counts=$(gx "$g" count-objects -v) || fail "reading the '
                'repository at $g failed"',
                '    [ -z "$refs" ] && [ "$(printf "%s\\n" "$counts" | sum_objects)" = 0 ] || fail "the '
                'repository at $g holds objects but no HEAD commit to reduce it to"',
                "    continue",
                "  fi",
                '  (reduce_one "$g" "$wt" HEAD) >/dev/null </dev/null || exit 3',
                "  nested=$((nested + 1))",
                "done <<POLAR_STORES",
                "$stores",
                "POLAR_STORES",
                'echo "$line nested=$nested"',
            ]
        )
        + "\n"
    )


def refusal(output: str, where: str) -> str:
    """The one-line refusal for a reduction at ``where`` (the image and workdir) that failed with
    ``output``."""
    found = re.search(rf"{re.escape(REFUSED)} (.*)", output)
    why = found.group(1).strip() if found else (output.strip().splitlines() or ["no output"])[-1][-300:]
    return f"{where}: its git history cannot be reduced to the base, so the task is refused: {why}"


def reduced_line(stdout: str) -> str:
    """The script's `REDUCED` line (what it did), or '' where it printed none."""
    return next((line for line in reversed(stdout.splitlines()) if line.startswith(REDUCED + " ")), "")

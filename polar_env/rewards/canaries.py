"""Canary tests a reader of this module cannot tell from the task's own: mutants of the F2P tests, in their
files.

A forgery inside the tested process (a new ``outcome`` on pytest's reports, a patched runner) sees
everything pytest sees, and its author may have read this file. So the grader writes its canaries
into its own copy of the F2P test files, keeps what they mean to itself, and makes each mutant
exchangeable with its original: nothing in the file says which of the two is the copy.

- **One canonicaliser.** Every test function of a canary-bearing file, originals included, is
  written out by ``ast.unparse`` (comments and formatting gone), checked to parse back to the same
  tree, and separated from its neighbours by the file's usual gap: no layout or spelling marks a copy.
- **One name distribution.** Every test of the file, originals included, gets a fresh name of 2-4 of
  the file's own test-name words: no name says "new" (all are) or "from the base tree" (none is). The
  grader maps the names back to the task's ids.
- **Independent positions.** A twinned test and its mutant are each put at a uniformly drawn place
  in their scope (module or class), in random order, after whatever their decorators and defaults
  need: neither place depends on the other's.
- **Mutations natural both ways.** A compared literal replaced by another literal of the same type
  drawn from the file's own (``== 3`` -> ``== 7``, ``"iso8601"`` -> ``"foo"``: the original could as
  well have been either), or a ``pytest.raises``/``assertRaises`` block toggled: unwrapped where
  the test has one, wrapped around a call statement the test reaches where it has one, each half the
  time where both are possible, so that a block present says nothing. Flips that real tests write mostly one
  way (``==`` -> ``!=``, ``in`` -> ``not in``, ``assertEqual`` -> ``assertNotEqual``) are not used. Every
  mutation is certain to fail where its original passes: a reached ``x == c`` that held cannot hold for ``c'
  != c``; a raises block around a statement that completed raises nothing; the exception a raises block caught
  propagates once it is unwrapped.
- **Nothing told.** The plugin learns nothing of which tests are canaries; that a canary must FAIL
  whenever its original PASSES in the same run is known only to the grader, which reads both
  outcomes from the result pipe.

What stays: a twin of a test the base tree already holds (``extra``) is told apart by comparing it
with the base's text (such twins stop untargeted forgeries only); a twin of an F2P test is told apart
only by running it on the fixed code, which is the one thing the forger lacks. Where no test of the
F2P files has a site to mutate, one plain failing test is the fallback (the weak case).
"""

from __future__ import annotations

import ast
import copy
import io
import re
import secrets
import tokenize
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

SUPPRESSING = {
    "raises",
    "assertRaises",
    "assertRaisesRegex",
    "assertRaisesRegexp",
    "suppress",
    "warns",
    "assertWarns",
    "assertWarnsRegex",
    "deprecated_call",
    "assertLogs",
}
UNWRAP = {"raises", "assertRaises", "assertRaisesRegex", "assertRaisesRegexp"}
EQUAL_CALLS = {"assertEqual", "assertEquals"}
DEFAULT_EXCEPTIONS = ("ValueError", "TypeError", "KeyError", "RuntimeError")
EXTRA_SOURCES = 2  # tests of the F2P files beyond the F2P ones that also get a mutant
Func = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class CanaryPlan:
    """The test files with their canaries, and what only the grader knows of them."""

    files: dict[str, str] = field(default_factory=dict)  # test file -> its text with the canaries
    # canary function id (``file::[Class::]name``) -> its original's function id as written (None: must fail
    # outright)
    expect: dict[str, str | None] = field(default_factory=dict)
    renamed: dict[str, str] = field(default_factory=dict)  # function id as written -> the task's function id

    def source_of(self, nodeid: str) -> tuple[bool, str | None]:
        """(whether ``nodeid`` is a canary, the node id of its original, as written, with the same
        parameters)."""
        func, bracket, params = nodeid.partition("[")
        if func not in self.expect:
            return False, None
        source = self.expect[func]
        return True, None if source is None else source + bracket + params

    def task_id(self, nodeid: str) -> str:
        """The task's id of a test as the run collected it (its name as written mapped back)."""
        func, bracket, params = nodeid.partition("[")
        return self.renamed.get(func, func) + bracket + params

    def written(self, nodeid: str) -> str:
        """The id under which a task test (or a directive naming one) runs in the planned files."""
        func, bracket, params = nodeid.partition("[")
        back = {task: new for new, task in self.renamed.items()}
        return back.get(func, func) + bracket + params

    def violations(self, statuses: dict[str, str], collected: list[str]) -> list[str]:
        """A canary not collected, or one that did not FAIL where its original PASSED (or, without an
        original, at all): the run is not believed. Ids as the run wrote them."""
        seen: set[str] = set()
        wrong: dict[str, str] = {}
        for nodeid in collected:
            is_canary, source = self.source_of(nodeid)
            if not is_canary:
                continue
            seen.add(nodeid.partition("[")[0])
            status = statuses.get(nodeid, "MISSING")
            if (source is None or statuses.get(source) == "PASSED") and status != "FAILED":
                wrong[nodeid] = status
        wrong.update({c: "NOT COLLECTED" for c in self.expect if c not in seen})
        return (
            [f"canary: {len(wrong)} canaries came out wrong, e.g. {dict(list(wrong.items())[:3])}"]
            if wrong
            else []
        )


def _call_name(node: ast.AST) -> str:
    func = node.func if isinstance(node, ast.Call) else None
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _exits(stmt: ast.stmt) -> bool:
    return any(isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom)) for n in ast.walk(stmt))


def _reached(
    body: list[ast.stmt], parent: list[ast.stmt] | None = None
) -> list[tuple[list[ast.stmt], ast.stmt]]:
    """(the body holding it, statement) for every statement that runs whenever the test passes: the
    body's, and those of the (non-suppressing) ``with`` blocks in it, up to the first that may return."""
    out: list[tuple[list[ast.stmt], ast.stmt]] = []
    for stmt in body:
        out.append((body, stmt))
        if isinstance(stmt, ast.With) and not any(
            _call_name(i.context_expr) in SUPPRESSING for i in stmt.items
        ):
            inner = _reached(stmt.body)
            out += inner
            if len(inner) < len(stmt.body) or any(_exits(s) for _, s in inner):
                return out
        if _exits(stmt):
            return out
    return out


def _literal_pool(tree: ast.Module) -> Counter:
    """The file's int and str constants (bools and docstrings aside), with their counts."""
    pool: Counter = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and type(node.value) in (int, str) and len(str(node.value)) < 80:
            pool[node.value] += 1
    return pool


def _other_literal(value: int | str, pool: Counter) -> int | str:
    """Another literal of ``value``'s type, drawn by count from the file's (so either could be the
    original); made up only where the file has no other."""
    same = [
        (v, n)
        for v, n in pool.items()
        if type(v) is type(value)
        and v != value
        and not (isinstance(v, str) and v.casefold() == str(value).casefold())
    ]
    if same:
        pick = secrets.randbelow(sum(n for _, n in same))
        for v, n in same:
            pick -= n
            if pick < 0:
                return v
    if isinstance(value, int):
        return value + (secrets.randbelow(9) + 1) * (1 if secrets.randbelow(2) else -1)
    return value + secrets.choice("abcdefghijklmnopqrstuvwxyz")


@dataclass
class _Site:
    kind: str  # "literal" | "unwrap" | "wrap"
    body: list[ast.stmt]
    stmt: ast.stmt
    node: ast.Constant | None = None
    siblings: list[Any] = field(default_factory=list)  # the values beside it in its display (not to be drawn)


def _sites(func: Func) -> list[_Site]:
    """Where ``func`` (a copy) can be made to fail for certain, by the mutations of the module docstring."""
    out: list[_Site] = []
    for body, stmt in _reached(func.body):
        compared: list[ast.expr] = []
        if (
            isinstance(stmt, ast.Assert)
            and isinstance(stmt.test, ast.Compare)
            and len(stmt.test.ops) == 1
            and isinstance(stmt.test.ops[0], ast.Eq)
        ):
            compared = [stmt.test.left, stmt.test.comparators[0]]
        elif (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Call)
            and _call_name(stmt.value) in EQUAL_CALLS
        ):
            compared = list(stmt.value.args[:2])
        for side in compared:  # the literal itself, or one element of a compared list/tuple/set display
            elements = side.elts if isinstance(side, (ast.List, ast.Tuple, ast.Set)) else [side]
            values = [e.value for e in elements if isinstance(e, ast.Constant)]
            out += [
                _Site("literal", body, stmt, e, values)
                for e in elements
                if isinstance(e, ast.Constant) and type(e.value) in (int, str)
            ]
        if (
            isinstance(stmt, ast.With)
            and len(stmt.items) == 1
            and _call_name(stmt.items[0].context_expr) in UNWRAP
        ):
            out.append(_Site("unwrap", body, stmt))
        if isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign)) and isinstance(stmt.value, ast.Call):
            out.append(_Site("wrap", body, stmt))  # what raises blocks hold in real tests: a call
    return out


def _raises_pool(tree: ast.Module) -> list[ast.expr]:
    """The exception expressions the file's raises blocks name (what a wrapped block expects)."""
    return [
        n.args[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and _call_name(n) in UNWRAP
        and n.args
        and isinstance(n.args[0], (ast.Name, ast.Attribute))
    ]


def _mutate(func: Func, tree: ast.Module, unittest_style: bool, pytest_bound: bool) -> Func | None:
    """A copy of ``func`` with one mutation drawn evenly among its families (literal, raises toggle)."""
    mutant = copy.deepcopy(func)
    if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in ast.walk(mutant)):
        return None
    sites = _sites(mutant)
    can_wrap = unittest_style or pytest_bound
    families = {
        "literal": [s for s in sites if s.kind == "literal"],
        "raises": [s for s in sites if s.kind == "unwrap" or (s.kind == "wrap" and can_wrap)],
    }
    families = {k: v for k, v in families.items() if v}
    if not families:
        return None
    chosen = families[secrets.choice(sorted(families))]
    if {s.kind for s in chosen} == {"unwrap", "wrap"}:  # a block present or absent says nothing: each half
        kind = secrets.choice(["unwrap", "wrap"])
        chosen = [s for s in chosen if s.kind == kind]
    site = secrets.choice(chosen)
    if site.kind == "literal":
        assert site.node is not None
        pool = _literal_pool(tree)
        for (
            value
        ) in site.siblings:  # a value already in its list/set would not make the comparison fail for sure
            pool.pop(value, None)
        assert isinstance(site.node.value, (int, str))  # what _sites picks
        site.node.value = _other_literal(site.node.value, pool)
    elif site.kind == "unwrap":
        assert isinstance(site.stmt, ast.With)
        at = site.body.index(site.stmt)
        site.body[at : at + 1] = site.stmt.body
    else:
        pool = _raises_pool(tree)
        expected = (
            copy.deepcopy(secrets.choice(pool))
            if pool
            else ast.Name(secrets.choice(DEFAULT_EXCEPTIONS), ast.Load())
        )
        owner = ast.Name("self" if unittest_style else "pytest", ast.Load())
        ctx = ast.Call(
            func=ast.Attribute(owner, "assertRaises" if unittest_style else "raises", ast.Load()),
            args=[expected],
            keywords=[],
        )
        at = site.body.index(site.stmt)
        site.body[at] = ast.With(
            items=[ast.withitem(context_expr=ctx, optional_vars=None)], body=[site.stmt], type_comment=None
        )
    return ast.fix_missing_locations(mutant)


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", None)
    return decorators[0].lineno if decorators else node.lineno


def _last_line(node: ast.stmt) -> int:
    return node.end_lineno or node.lineno  # always set on a parsed tree


def _canonical(func: Func, indent: str) -> str:
    """The one way every test of the file is written: ``ast.unparse``, indented to its scope (never the
    inside of a multi-line string: a docstring keeps its value)."""
    text = ast.unparse(func)
    inside: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.STRING and token.end[0] > token.start[0]:
            inside.update(range(token.start[0] + 1, token.end[0] + 1))
    return (
        "".join(
            indent + line if line.strip() and n not in inside else line
            for n, line in enumerate(text.splitlines(keepends=True), 1)
        )
        + "\n"
    )


def _same_tree(func: Func, text: str) -> bool:
    try:
        back = ast.parse(text.strip() if not text.startswith(" ") else "if 1:\n" + text).body[0]
    except SyntaxError:
        return False
    back = back.body[0] if isinstance(back, ast.If) else back
    return ast.dump(back) == ast.dump(func)


def _bound_names(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _needs(func: Func) -> set[str]:
    """Names ``func``'s definition evaluates: decorators, defaults, annotations."""
    parts: list[ast.AST] = [
        *func.decorator_list,
        *func.args.defaults,
        *[d for d in func.args.kw_defaults if d],
    ]
    args = [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs, func.args.vararg, func.args.kwarg]
    parts += [a.annotation for a in args if a is not None and a.annotation is not None]
    parts += [func.returns] if func.returns is not None else []
    return {n.id for p in parts for n in ast.walk(p) if isinstance(n, ast.Name)}


class _Unsupported(Exception):
    """A file this module does not rewrite (statements sharing a line, a test named by other code)."""


@dataclass
class _Item:
    stmt: ast.stmt
    test: bool  # a test function, written canonically
    text: str = ""  # a test's canonical text


class _Rewrite:
    """One F2P file rewritten: every test renamed and written canonically, the chosen ones twinned."""

    def __init__(self, text: str, prefix: str) -> None:
        self.text, self.prefix = text, prefix
        self.lines = text.splitlines(keepends=True)
        self.tree = ast.parse(text)
        self.pytest_bound = any(
            isinstance(s, ast.Import) and any(a.name == "pytest" and a.asname is None for a in s.names)
            for s in self.tree.body
        )
        self.tests: dict[
            str, tuple[list[ast.stmt], Func, bool]
        ] = {}  # task fid -> (scope body, def, unittest)
        self._collect(self.tree.body, "", False)
        words = {w for f in self.tests for w in f.rpartition("::")[2].removeprefix(prefix).split("_") if w}
        self.words = sorted(words) or ["case"]
        named = Counter(n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name))
        named.update(n.attr for n in ast.walk(self.tree) if isinstance(n, ast.Attribute))
        if any(named[f.name] for _, f, _ in self.tests.values()):
            raise _Unsupported("a test function is named by other code of its file")
        # never a name the file had (the originals' included): no name says "from the base tree"
        self.taken = {
            n.name
            for n in ast.walk(self.tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        }
        self.names: dict[int, str] = {}  # id(def) -> its name as written
        self.twins: dict[int, list[Func]] = {}  # id(original def) -> [mutant]
        self.expect: dict[str, str] = {}  # canary fid -> original fid, as written
        self.renamed: dict[str, str] = {}  # fid as written -> task fid

    def _collect(self, body: list[ast.stmt], scope: str, unittest_style: bool) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
                self.prefix
            ):
                self.tests[scope + node.name] = (body, node, unittest_style)
            elif isinstance(node, ast.ClassDef):
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
                self._collect(node.body, f"{scope}{node.name}::", any(b.endswith("TestCase") for b in bases))

    def fresh_name(self) -> str:
        """2-4 of the file's test-name words; where those run out, one of them numbered (``test_parse_2``),
        as hand-written suites name variants. Every test of the file is named so, originals included."""
        for _ in range(256):
            picked = dict.fromkeys(secrets.choice(self.words) for _ in range(2 + secrets.randbelow(3)))
            name = self.prefix + "_".join(picked)
            if name not in self.taken:
                self.taken.add(name)
                return name
        stem, n = self.prefix + "_".join(self.words[:2]), 2
        while f"{stem}_{n}" in self.taken:
            n += 1
        self.taken.add(f"{stem}_{n}")
        return f"{stem}_{n}"

    def twin(self, fid: str) -> bool:
        _body, func, unittest_style = self.tests[fid]
        mutant = _mutate(func, self.tree, unittest_style, self.pytest_bound)
        if mutant is None:
            return False
        self.twins[id(func)] = [mutant]
        return True

    def render(self) -> str:
        for fid, (_body, func, _u) in self.tests.items():
            self.names[id(func)] = self.fresh_name()
            scope = fid.rpartition("::")[0]
            self.renamed[f"{scope + '::' if scope else ''}{self.names[id(func)]}"] = fid
            for mutant in self.twins.get(id(func), []):
                mutant.name = self.names[id(mutant)] = self.fresh_name()
                self.expect[f"{scope + '::' if scope else ''}{mutant.name}"] = (
                    f"{scope + '::' if scope else ''}{self.names[id(func)]}"
                )
        head = "".join(self.lines[: _first_line(self.tree.body[0]) - 1]) if self.tree.body else self.text
        return head + self._scope(self.tree.body, "") + "".join(self.lines[self.tree.body[-1].end_lineno :])

    def _gap(self, body: list[ast.stmt], test_ids: set[int]) -> int:
        gaps = Counter(
            _first_line(b) - _last_line(a) - 1
            for a, b in zip(body, body[1:], strict=False)
            if id(b) in test_ids
        )
        return gaps.most_common(1)[0][0] if gaps else 1

    def _scope(self, body: list[ast.stmt], indent: str) -> str:
        for a, b in zip(body, body[1:], strict=False):
            if _first_line(b) <= _last_line(a):
                raise _Unsupported("statements share a line")
        test_ids = {id(f) for _, f, _ in self.tests.values()}
        gap = "\n" * max(self._gap(body, test_ids), 0)
        items = [_Item(s, id(s) in test_ids) for s in body]
        for item in list(items):
            if id(item.stmt) in self.twins:  # both twins placed anew, each on its own draw
                items.remove(item)
                pair = [item.stmt, *self.twins[id(item.stmt)]]
                for func in secrets.SystemRandom().sample(pair, len(pair)):
                    slots = self._slots(items, func)
                    items.insert(secrets.choice(slots), _Item(func, True))
        out: list[str] = []
        for i, item in enumerate(items):
            stmt = item.stmt
            if item.test:
                assert isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
                func = copy.copy(stmt)
                func.name = self.names[id(stmt)]
                text = _canonical(func, indent)
                renamed = copy.copy(stmt)
                renamed.name = func.name
                if not _same_tree(renamed, text):
                    raise _Unsupported(f"{stmt.name} does not survive ast.unparse")
                out.append((gap if i else "") + text)
                continue
            prev = body.index(stmt) - 1 if stmt in body else -1
            sep = (
                "".join(self.lines[body[prev].end_lineno : _first_line(stmt) - 1])
                if prev >= 0 and i
                else (gap if i else "")
            )
            if isinstance(stmt, ast.ClassDef) and any(id(s) in test_ids for s in stmt.body):
                head = "".join(self.lines[_first_line(stmt) - 1 : _first_line(stmt.body[0]) - 1])
                inner = " " * stmt.body[0].col_offset
                out.append(sep + head + self._scope(stmt.body, inner))
            else:
                out.append(sep + "".join(self.lines[_first_line(stmt) - 1 : stmt.end_lineno]))
        return "".join(out)

    @staticmethod
    def _slots(items: list[_Item], func: Func) -> list[int]:
        """Where ``func`` may go: after the scope's imports and docstring, and after every statement binding
        a name its definition evaluates."""
        needs = _needs(func)
        last = -1
        for i, item in enumerate(items):
            stmt = item.stmt
            docstring = i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            if (
                docstring
                or isinstance(stmt, (ast.Import, ast.ImportFrom))
                or (not item.test and _bound_names(stmt) & needs)
            ):
                last = i
        return list(range(last + 1, len(items) + 1))


def plan_canaries(
    sources: dict[str, str], f2p: list[str], *, prefix: str = "test_", extra: int = EXTRA_SOURCES
) -> CanaryPlan:
    """Mutants of the F2P tests (and of ``extra`` other tests of their files) written into ``sources``
    (test file -> text), every test of those files renamed and written canonically. A file that does
    not parse, or that this module does not rewrite, is left as it is."""
    plan = CanaryPlan()
    wanted: dict[str, list[str]] = {}
    for test_id in f2p:
        rel, _, rest = test_id.partition("::")
        if rest:
            wanted.setdefault(rel, []).append(rest.partition("[")[0])
    for rel, funcs in wanted.items():
        text = sources.get(rel)
        try:
            rewrite = _Rewrite(text, prefix) if text is not None else None
            if rewrite is None:
                continue
            others = [f for f in rewrite.tests if f not in funcs]
            chosen = list(dict.fromkeys(funcs)) + [
                others.pop(secrets.randbelow(len(others))) for _ in range(min(extra, len(others)))
            ]
            if not any([rewrite.twin(fid) for fid in chosen if fid in rewrite.tests]):
                continue
            written = rewrite.render()
            ast.parse(written)
        except (SyntaxError, ValueError, _Unsupported, RecursionError):
            continue
        plan.files[rel] = written
        plan.expect.update({f"{rel}::{c}": f"{rel}::{s}" for c, s in rewrite.expect.items()})
        plan.renamed.update({f"{rel}::{w}": f"{rel}::{t}" for w, t in rewrite.renamed.items()})
    if not plan.files and wanted:
        rel = next(iter(wanted))
        if rel in sources:
            taken = set(re.findall(r"^\s*(?:async\s+def|def|class)\s+(\w+)", sources[rel], re.M))
            words = [w for f in wanted[rel] for w in f.rpartition("::")[2].split("_")[1:] if w] or ["case"]
            name, n = prefix + "_".join(words[:2]), 2
            while f"{name}_{n}" in taken:
                n += 1
            name = f"{name}_{n}"
            a, b = secrets.randbelow(90) + 10, secrets.randbelow(90) + 10
            plan.files[rel] = (
                sources[rel].rstrip("\n") + f"\n\n\ndef {name}():\n    value = {a} * {b}\n"
                f"    assert value == {a * b + 1}\n"
            )
            plan.expect[f"{rel}::{name}"] = None
    return plan

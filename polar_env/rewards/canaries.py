"""Canary tests only the grader can tell from the task's own: mutants of the F2P tests, in their files.

A forgery inside the tested process (a new ``outcome`` on pytest's reports, a patched runner) sees
everything pytest sees. Canaries it can pick out (names, bodies or expectations held by the plugin,
functions defined in memory) let it lie for every test but them. So the grader writes its canaries
into its own copy of the F2P test files before the run, and keeps what they mean to itself:

- each canary is a copy of one of the task's tests (an F2P test first, they are new to the agent
  too), decorators and fixtures included, with one assertion the test reaches made false: a
  compared literal changed (``== 3`` -> ``== 7``), the comparison negated (``==`` -> ``!=``,
  ``in`` -> ``not in``, ``assertEqual`` -> ``assertNotEqual``), ``assert x`` -> ``assert not x``, or a
  ``pytest.raises`` block unwrapped. Only that span of text changes;
- it is named from the file's own test-name words and placed just before or just after its
  original, so neither its name, its position nor the file says which of the two is the copy;
- the plugin is told nothing: which tests are canaries, and that a canary must FAIL whenever its
  original PASSES in the same run, is known only to the grader, which reads both outcomes from the
  result pipe.

A run that reports both a test and its mutant passing is lying about one of them; the forger must
tell the original from its copy by content alone. Where no test of the F2P files has an assertion
to invert, one plain failing test is the fallback (the weak case, as canaries were before).
"""

from __future__ import annotations

import ast
import re
import secrets
from dataclasses import dataclass, field

SUPPRESSING = {"raises", "assertRaises", "assertRaisesRegex", "assertRaisesRegexp", "suppress", "warns",
               "assertWarns", "assertWarnsRegex", "deprecated_call", "assertLogs"}
UNWRAP = {"raises", "assertRaises", "assertRaisesRegex", "assertRaisesRegexp"}
OP_FLIPS = {ast.Eq: "!=", ast.NotEq: "==", ast.Is: "is not", ast.IsNot: "is", ast.In: "not in", ast.NotIn: "in"}
OP_TOKEN = re.compile(r"==|!=|\bis\s+not\b|\bnot\s+in\b|\bis\b|\bin\b")
UNITTEST_FLIPS = {"assertEqual": "assertNotEqual", "assertEquals": "assertNotEqual", "assertNotEqual": "assertEqual",
                  "assertTrue": "assertFalse", "assertFalse": "assertTrue", "assertIs": "assertIsNot",
                  "assertIsNot": "assertIs", "assertIsNone": "assertIsNotNone", "assertIsNotNone": "assertIsNone",
                  "assertIn": "assertNotIn", "assertNotIn": "assertIn", "assertIsInstance": "assertNotIsInstance",
                  "assertNotIsInstance": "assertIsInstance"}
EXTRA_SOURCES = 2  # tests of the F2P files beyond the F2P ones that also get a mutant


@dataclass
class CanaryPlan:
    """The test files with their canaries, and what only the grader knows of them."""

    files: dict[str, str] = field(default_factory=dict)  # test file -> its text with the canaries
    # canary function id (``file::[Class::]name``) -> its original's function id (None: must fail outright)
    expect: dict[str, str | None] = field(default_factory=dict)

    def source_of(self, nodeid: str) -> tuple[bool, str | None]:
        """(whether ``nodeid`` is a canary, the node id of its original with the same parameters)."""
        func, bracket, params = nodeid.partition("[")
        if func not in self.expect:
            return False, None
        source = self.expect[func]
        return True, None if source is None else source + bracket + params

    def violations(self, statuses: dict[str, str], collected: list[str]) -> list[str]:
        """A canary not collected, or one that did not FAIL where its original PASSED (or, without an
        original, at all): the run is not believed."""
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
        return [f"canary: {len(wrong)} canaries came out wrong, e.g. {dict(list(wrong.items())[:3])}"] if wrong else []


def _call_name(node: ast.AST) -> str:
    func = node.func if isinstance(node, ast.Call) else None
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _exits(stmt: ast.stmt) -> bool:
    return any(isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom)) for n in ast.walk(stmt))


def _reached(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements that run whenever the test passes: the body's, and those of the (non-suppressing)
    ``with`` blocks in it, up to the first that may return early."""
    out: list[ast.stmt] = []
    for stmt in body:
        out.append(stmt)
        if isinstance(stmt, ast.With) and not any(_call_name(i.context_expr) in SUPPRESSING for i in stmt.items):
            inner = _reached(stmt.body)
            out += inner
            if len(inner) < len(stmt.body) or any(_exits(s) for s in inner):
                return out
        if _exits(stmt):
            return out
    return out


class _Source:
    """A file's text with byte offsets for ast positions (col_offset counts UTF-8 bytes)."""

    def __init__(self, text: str) -> None:
        self.data = text.encode()
        self.starts = [0]
        for line in self.data.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def at(self, lineno: int, col: int) -> int:
        return self.starts[lineno - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno, node.end_col_offset)

    def text(self, start: int, end: int) -> str:
        return self.data[start:end].decode()


def _other_literal(node: ast.Constant, seg: str) -> str | None:
    value = node.value
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    if isinstance(value, int):
        return str(value + (secrets.randbelow(9) + 1) * (1 if value < 2 or secrets.randbelow(2) else -1))
    if not re.fullmatch(r"""(["'])[^"'\\\n]*\1""", seg):
        return None
    body, quote = seg[1:-1], seg[0]
    pool = "abcdefghijklmnopqrstuvwxyz0123456789"
    if body and secrets.randbelow(2):
        i = secrets.randbelow(len(body))
        new = secrets.choice([c for c in pool if c != body[i]])
        return quote + body[:i] + new + body[i + 1:] + quote
    return quote + body + secrets.choice(pool) + quote


def _edits(src: _Source, stmt: ast.stmt) -> list[tuple[int, int, str]]:
    """The ways to make ``stmt`` (reached by a passing test) fail, each one span replaced."""
    out: list[tuple[int, int, str]] = []
    if isinstance(stmt, ast.Assert):
        test = stmt.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            left, right = test.left, test.comparators[0]
            if isinstance(test.ops[0], ast.Eq):
                for lit in (right, left):
                    if isinstance(lit, ast.Constant):
                        start, end = src.span(lit)
                        if (new := _other_literal(lit, src.text(start, end))) is not None:
                            out.append((start, end, new))
            flip = OP_FLIPS.get(type(test.ops[0]))
            if flip:
                gap_start, gap_end = src.span(left)[1], src.span(right)[0]
                gap = src.text(gap_start, gap_end)
                if len(OP_TOKEN.findall(gap)) == 1:
                    out.append((gap_start, gap_end, OP_TOKEN.sub(flip, gap)))
        if not out and isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            start, end = src.span(test)
            out.append((start, end, src.text(*src.span(test.operand))))
        if not out:
            start, end = src.span(test)
            simple = isinstance(test, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
            seg = src.text(start, end)
            out.append((start, end, f"not {seg}" if simple else f"not ({seg})"))
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        if (isinstance(func, ast.Attribute) and func.attr in UNITTEST_FLIPS and isinstance(func.value, ast.Name)
                and func.value.id == "self"):
            end = src.span(func)[1]
            out.append((end - len(func.attr), end, UNITTEST_FLIPS[func.attr]))
    elif (isinstance(stmt, ast.With) and len(stmt.items) == 1 and _call_name(stmt.items[0].context_expr) in UNWRAP
          and stmt.body[0].lineno > stmt.lineno):
        start = src.at(stmt.lineno, 0)
        end = src.at(stmt.end_lineno, stmt.end_col_offset)
        body = src.text(src.at(stmt.body[0].lineno, 0), end)
        shift = stmt.body[0].col_offset - stmt.col_offset
        out.append((start, end, "".join(line[shift:] if line.strip() else line
                                        for line in body.splitlines(keepends=True))))
    return out


def _mutant(src: _Source, func: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> str | None:
    """The source of ``func`` (decorators included) renamed to ``name``, with one reached assertion made false."""
    sites = [e for stmt in _reached(func.body) for e in _edits(src, stmt)]
    if not sites:
        return None
    start, end, new = secrets.choice(sites)
    first = func.decorator_list[0].lineno if func.decorator_list else func.lineno
    f_start, f_end = src.at(first, 0), src.at(func.end_lineno, func.end_col_offset)
    text = src.text(f_start, start) + new + src.text(end, f_end)
    renamed, n = re.subn(rf"(\bdef\s+){re.escape(func.name)}(\s*\()", rf"\g<1>{name}\g<2>", text, count=1)
    return renamed + "\n" if n else None


def _functions(tree: ast.Module, prefix: str) -> dict[str, tuple[list[ast.stmt], ast.FunctionDef | ast.AsyncFunctionDef]]:
    """``[Class::]name`` -> (the body holding it, the def) for the test functions of a module."""
    out: dict[str, tuple[list[ast.stmt], ast.FunctionDef | ast.AsyncFunctionDef]] = {}

    def walk(body: list[ast.stmt], scope: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(prefix):
                out[scope + node.name] = (body, node)
            elif isinstance(node, ast.ClassDef):
                walk(node.body, f"{scope}{node.name}::")
    walk(tree.body, "")
    return out


def _new_name(words: list[str], taken: set[str], prefix: str) -> str:
    """A name of 2-4 of the file's own test-name words; where those run out, one of them numbered
    (``test_parse_2``), as hand-written suites name variants. Never a word the file does not use: a
    made-up word would tell a forger which test is the copy."""
    pool = words or ["case"]
    for _ in range(256):
        picked = dict.fromkeys(secrets.choice(pool) for _ in range(2 + secrets.randbelow(3)))
        name = prefix + "_".join(picked)
        if name not in taken:
            taken.add(name)
            return name
    stem, n = prefix + "_".join(pool[:2]), 2
    while f"{stem}_{n}" in taken:
        n += 1
    taken.add(f"{stem}_{n}")
    return f"{stem}_{n}"


def plan_canaries(sources: dict[str, str], f2p: list[str], *, prefix: str = "test_",
                  extra: int = EXTRA_SOURCES) -> CanaryPlan:
    """Mutants of the F2P tests (and of ``extra`` other tests of their files) written into ``sources``
    (test file -> text). A file that does not parse is left as it is (the run reports its error)."""
    plan = CanaryPlan()
    wanted: dict[str, list[str]] = {}
    for test_id in f2p:
        rel, _, rest = test_id.partition("::")
        if rest:
            wanted.setdefault(rel, []).append(rest.partition("[")[0])
    made_any = False
    for rel, funcs in wanted.items():
        text = sources.get(rel)
        try:
            tree = ast.parse(text) if text is not None else None
        except (SyntaxError, ValueError):
            tree = None
        if tree is None:
            continue
        src, found = _Source(text), _functions(tree, prefix)
        others = [f for f in found if f not in funcs]
        chosen = list(dict.fromkeys(funcs)) + [others.pop(secrets.randbelow(len(others)))
                                               for _ in range(min(extra, len(others)))]
        words = sorted({w for f in found for w in f.rpartition("::")[2].removeprefix(prefix).split("_") if w})
        taken = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        inserts: list[tuple[int, str]] = []
        for fid in chosen:
            if fid not in found:
                continue
            _body, func = found[fid]
            name = _new_name(words, taken, prefix)
            mutant = _mutant(src, func, name)
            if mutant is None:
                continue
            first = func.decorator_list[0].lineno if func.decorator_list else func.lineno
            at = src.at(first, 0) if secrets.randbelow(2) else src.starts[min(func.end_lineno, len(src.starts) - 1)]
            inserts.append((at, "\n" + mutant + "\n"))
            scope = fid.rpartition("::")[0]
            plan.expect[f"{rel}::{scope + '::' if scope else ''}{name}"] = f"{rel}::{fid}"
        if inserts:
            plan.files[rel] = _apply(src.data, inserts)
            made_any = True
    if not made_any and wanted:
        rel = next(iter(wanted))
        if rel in sources:
            taken = set(re.findall(r"^\s*(?:async\s+def|def|class)\s+(\w+)", sources[rel], re.M))
            name = _new_name([w for f in wanted[rel] for w in f.rpartition("::")[2].split("_")[1:] if w], taken, prefix)
            a, b = secrets.randbelow(90) + 10, secrets.randbelow(90) + 10
            plan.files[rel] = sources[rel].rstrip("\n") + f"\n\n\ndef {name}():\n    value = {a} * {b}\n" \
                f"    assert value == {a * b + 1}\n"
            plan.expect[f"{rel}::{name}"] = None
    for rel, text in plan.files.items():  # a mutant that does not parse is never written
        try:
            ast.parse(text)
        except SyntaxError:
            plan.files[rel] = sources[rel]
            plan.expect = {c: s for c, s in plan.expect.items() if not c.startswith(rel + "::")}
    return plan


def _apply(data: bytes, inserts: list[tuple[int, str]]) -> str:
    for at, text in sorted(inserts, key=lambda x: -x[0]):
        data = data[:at] + text.encode() + data[at:]
    return data.decode()

#!/usr/bin/env python3
"""Rebuild the bundled SWE-bench Verified tasks from PyPI sdists (docs/rewards.md).

For each task: download the pinned release sdist that contains the upstream fix (sha256
checked), revert the fix, its new test and its changelog line to get the base tree, diff the
reverted hunks back in to get the gold patch and the test patch, then derive FAIL_TO_PASS /
PASS_TO_PASS by running the tests (in the grading sandbox) without and with the gold patch, as
SWE-bench's validation does. Writes polar_env/tasks/bundled/<instance_id>/{task.json,base.tar.gz}.

    .venv/bin/python scripts/build_bundled_tasks.py [--only ID ...] [--out DIR]

Needs PyPI (sdists and the pinned test environments) and bubblewrap.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from polar_env.cache import cache_root  # noqa: E402
from polar_env.cli.task_toolkit import TaskDefect, derive_tests, deterministic_targz  # noqa: E402
from polar_env.tasks.env import ensure_task_env  # noqa: E402
from polar_env.tasks.models import Task, TaskEnvironment  # noqa: E402
from polar_env.tasks.runtime import instance_image  # noqa: E402
from polar_env.tasks.tree import git, init_single_commit  # noqa: E402

PYTEST_PINS = ["pytest==7.3.1", "iniconfig==2.0.0", "packaging==23.1", "pluggy==1.0.0"]
REQUESTS_227_PINS = [
    "urllib3==1.26.8",
    "idna==3.3",
    "certifi==2021.10.8",
    "charset-normalizer==2.0.10",
    "pytest-mock==3.10.0",
    *PYTEST_PINS,
]


@dataclass
class Edit:
    """In the release file `path`, `fixed` (present once) becomes `base` in the base tree."""

    path: str
    fixed: str
    base: str


@dataclass
class Spec:
    instance_id: str
    repo: str
    version: str
    sdist: str  # name==version
    sdist_file: str
    sha256: str
    problem_statement: str
    gold: list[Edit]
    test: list[Edit]
    test_directives: list[str]
    requirements: list[str]
    env: dict[str, str]
    doc: list[Edit] = field(default_factory=list)  # changelog lines: reverted in base, not in gold
    drop: list[str] = field(default_factory=list)  # sdist paths left out of the base tree
    python: str = "3.11"


SPECS = [
    Spec(
        instance_id="pallets__flask-5014",
        repo="pallets/flask",
        version="2.3",
        sdist="flask==2.3.0",
        sdist_file="Flask-2.3.0.tar.gz",
        sha256="4088b4986f13cae23e02081e67df7e4e434ec6f85a5238bce5e6db6d1de61e06",
        problem_statement=(
            "Require a non-empty name for Blueprints\n"
            "Things do not work correctly if a Blueprint is given an empty name (e.g. #4944).\n"
            "It would be helpful if a `ValueError` was raised when trying to do that.\n"
        ),
        gold=[
            Edit(
                "src/flask/blueprints.py",
                fixed="        if not name:\n            raise ValueError(\"'name' may not be empty.\")\n\n"
                '        if "." in name:\n',
                base='        if "." in name:\n',
            )
        ],
        test=[
            Edit(
                "tests/test_blueprints.py",
                fixed="def test_empty_name_not_allowed(app, client):\n    with pytest.raises(ValueError):\n"
                '        flask.Blueprint("", __name__)\n\n\ndef test_dotted_names_from_app(',
                base="def test_dotted_names_from_app(",
            )
        ],
        doc=[
            Edit(
                "CHANGES.rst",
                fixed="-   If a blueprint is created with an empty name it raises a ``ValueError``.\n"
                "    :issue:`5010`\n",
                base="",
            )
        ],
        drop=["docs", "examples"],
        test_directives=["tests/test_blueprints.py"],
        requirements=[
            "werkzeug==2.3.0",
            "jinja2==3.1.2",
            "markupsafe==2.1.2",
            "itsdangerous==2.1.2",
            "click==8.1.3",
            "blinker==1.6.2",
            *PYTEST_PINS,
        ],
        env={"PYTHONPATH": "{testbed}/src"},
    ),
    Spec(
        instance_id="psf__requests-5414",
        repo="psf/requests",
        version="2.26",
        sdist="requests==2.27.0",
        sdist_file="requests-2.27.0.tar.gz",
        sha256="8e5643905bf20a308e25e4c1dd379117c09000bf8a82ebccc462cfb1b34a16b5",
        problem_statement=(
            "Getting http://.example.com raises UnicodeError\n"
            "Attempting to get e.g. `http://.example.com` results in a `UnicodeError`. It seems like the "
            "intention so far has been to raise `InvalidUrl` instead (see e.g. the `InvalidURL('URL has an "
            "invalid label.')` raised in `PreparedRequest.prepare_url` in requests/models.py).\n\n"
            "I see there was some hesitation in fixing a similar issue (#4168) and would like to add that "
            "even catching the error just to rethrow as a requests exception would be beneficial.\n\n"
            "## Expected Result\n\nBased on PR #774: `InvalidUrl: URL has an invalid label.`\n\n"
            "## Actual Result\n\n"
            "`UnicodeError: encoding with 'idna' codec failed (UnicodeError: label empty or too long)`\n\n"
            '## Reproduction Steps\n\n```python3\nimport requests\nrequests.get("http://.example.com")\n```\n'
        ),
        gold=[
            Edit(
                "requests/models.py",
                fixed="        elif host.startswith((u'*', u'.')):\n",
                base="        elif host.startswith(u'*'):\n",
            )
        ],
        test=[
            Edit(
                "tests/test_requests.py",
                fixed="            (InvalidURL, 'http://*example.com'),\n            (InvalidURL, 'http://.example.com'),\n",
                base="            (InvalidURL, 'http://*example.com'),\n",
            )
        ],
        doc=[
            Edit(
                "HISTORY.md",
                fixed="- Fixed idna exception leak, wrapping `UnicodeError` with\n"
                "  `requests.exceptions.InvalidURL` for URLs with a leading dot (.) in the\n"
                "  domain. (#5414)\n\n",
                base="",
            )
        ],
        test_directives=["tests/test_requests.py"],
        requirements=REQUESTS_227_PINS,
        env={"PYTHONPATH": "{testbed}"},
    ),
    Spec(
        instance_id="psf__requests-6028",
        repo="psf/requests",
        version="2.27",
        sdist="requests==2.27.1",
        sdist_file="requests-2.27.1.tar.gz",
        sha256="68d7c56fd5a8999887728ef304a6d12edc7be74f1cfa47714fc8b414525c9a61",
        problem_statement=(
            "Proxy authentication bug\n"
            "When using proxies in python 3.8.12, I get an error 407. Using any other version of python "
            "works fine. I am assuming it could be to do with this "
            "https://docs.python.org/3/whatsnew/3.8.html#notable-changes-in-python-3-8-12.\n\n"
            "I should get a status of 200.\n\nI get a status code of 407.\n\n"
            "```python\nimport requests\n\n\nr = requests.get('https://example.org/', proxies=proxies) "
            "# You will need a proxy to test with, I am using a paid service.\nprint(r.status_code)\n```\n"
        ),
        gold=[
            Edit(
                "requests/utils.py",
                fixed="    if auth:\n        # parse_url doesn't provide the netloc with auth\n"
                "        # so we'll add it ourselves.\n        netloc = '@'.join([auth, netloc])\n"
                "    if scheme is None:\n        scheme = new_scheme\n",
                base="    if scheme is None:\n        scheme = new_scheme\n",
            )
        ],
        test=[
            Edit(
                "tests/test_utils.py",
                fixed="        ('example.com:80', 'http://example.com:80'),\n        (\n"
                "            'http://user:pass@example.com/path?query',\n"
                "            'http://user:pass@example.com/path?query'\n        ),\n        (\n"
                "            'http://user@example.com/path?query',\n"
                "            'http://user@example.com/path?query'\n        )\n    ))\n",
                base="        ('example.com:80', 'http://example.com:80'),\n    ))\n",
            )
        ],
        doc=[
            Edit(
                "HISTORY.md",
                fixed="2.27.1 (2022-01-05)\n-------------------\n\n**Bugfixes**\n\n"
                "- Fixed parsing issue that resulted in the `auth` component being\n"
                "  dropped from proxy URLs. (#6028)\n\n",
                base="",
            )
        ],
        test_directives=["tests/test_utils.py"],
        requirements=REQUESTS_227_PINS,
        env={"PYTHONPATH": "{testbed}"},
    ),
    Spec(
        instance_id="marshmallow-code__marshmallow-1359",
        repo="marshmallow-code/marshmallow",
        version="3.0",
        sdist="marshmallow==3.0.1",
        sdist_file="marshmallow-3.0.1.tar.gz",
        sha256="23f684b54b1955ebd5bdfbdda4062e438ef86218f14f1a356f570cdf0c016ab3",
        problem_statement=(
            "3.0: DateTime fields cannot be used as inner field for List or Tuple fields\n"
            "Between releases 3.0.0rc8 and 3.0.0rc9, `DateTime` fields have started throwing an error when "
            "being instantiated as inner fields of container fields like `List` or `Tuple`. The snippet "
            "below works in <=3.0.0rc8 and throws the error below in >=3.0.0rc9 (and, worryingly, 3.0.0):\n\n"
            "```python\nfrom marshmallow import fields, Schema\n\nclass MySchema(Schema):\n"
            "    times = fields.List(fields.DateTime())\n\ns = MySchema()\n```\n\nTraceback:\n```\n"
            'Traceback (most recent call last):\n  File "test-mm.py", line 8, in <module>\n'
            '    s = MySchema()\n  ...\n  File ".../marshmallow/fields.py", line 1117, in _bind_to_schema\n'
            "    or getattr(schema.opts, self.SCHEMA_OPTS_VAR_NAME)\n"
            "AttributeError: 'List' object has no attribute 'opts'\n```\n\n"
            "It seems like it's treating the parent field as a Schema without checking that it is indeed a "
            "schema, so the `schema.opts` statement fails as fields don't have an `opts` attribute.\n"
        ),
        gold=[
            Edit(
                "src/marshmallow/fields.py",
                fixed="            or getattr(self.root.opts, self.SCHEMA_OPTS_VAR_NAME)\n",
                base="            or getattr(schema.opts, self.SCHEMA_OPTS_VAR_NAME)\n",
            )
        ],
        test=[
            Edit(
                "tests/test_fields.py",
                fixed='        assert schema2.fields["foo"].value_field.root == schema2\n\n'
                "    # Regression test for https://github.com/marshmallow-code/marshmallow/issues/1357\n"
                "    def test_datetime_list_inner_format(self, schema):\n"
                "        class MySchema(Schema):\n"
                "            foo = fields.List(fields.DateTime())\n"
                "            bar = fields.Tuple((fields.DateTime(),))\n\n"
                "            class Meta:\n"
                '                datetimeformat = "iso8601"\n'
                '                dateformat = "iso8601"\n\n'
                "        schema = MySchema()\n"
                '        assert schema.fields["foo"].inner.format == "iso8601"\n'
                '        assert schema.fields["bar"].tuple_fields[0].format == "iso8601"\n',
                base='        assert schema2.fields["foo"].value_field.root == schema2\n',
            )
        ],
        doc=[
            Edit(
                "CHANGELOG.rst",
                fixed="3.0.1 (2019-08-21)\n++++++++++++++++++\n\nBug fixes:\n\n"
                "- Fix bug when nesting ``fields.DateTime`` within ``fields.List`` or ``fields.Tuple`` "
                "(:issue:`1357`).\n  This bug was introduced in 3.0.0rc9. Thanks :user:`zblz` for "
                "reporting.\n\n",
                base="",
            )
        ],
        drop=["docs", "examples"],
        test_directives=["tests/test_fields.py"],
        requirements=["pytz==2023.3", "simplejson==3.19.1", *PYTEST_PINS],
        env={"PYTHONPATH": "{testbed}/src"},
    ),
    Spec(
        instance_id="pytest-dev__pytest-10051",
        repo="pytest-dev/pytest",
        version="7.2",
        sdist="pytest==7.2.0",
        sdist_file="pytest-7.2.0.tar.gz",
        sha256="c4014eb40e10f11f355ad4e3c2fb2c6c6d1919c73f3b5a433de4708202cade59",
        problem_statement=(
            "caplog.get_records and caplog.clear conflict\n# Description\n\n"
            "`caplog.get_records()` gets decoupled from actual caplog records when `caplog.clear()` is "
            "called. As a result, after `caplog.clear()` is called, `caplog.get_records()` is frozen: it "
            "does not get cleared, nor does it get new records.\n\n"
            "During test set up it is set to the same list as `caplog.records`, but the latter gets "
            "replaced rather than cleared in `caplog.clear()`, which diverges the two objects.\n\n"
            "# Reproductive example\n```python\nimport logging\n\ndef test(caplog) -> None:\n"
            "    def verify_consistency() -> None:\n"
            '        assert caplog.get_records("call") == caplog.records\n\n'
            '    verify_consistency()\n    logging.warning("test")\n    verify_consistency()\n'
            "    caplog.clear()\n"
            "    verify_consistency()  # fails: assert [<LogRecord: root, 30, test_reproduce.py, 7, "
            '"test">] == []\n'
            "```\n"
        ),
        gold=[
            Edit(
                "src/_pytest/logging.py",
                fixed="        self.records = []\n        self.stream = StringIO()\n\n"
                "    def clear(self) -> None:\n        self.records.clear()\n"
                "        self.stream = StringIO()\n",
                base="        self.records = []\n        self.stream = StringIO()\n",
            ),
            Edit(
                "src/_pytest/logging.py",
                fixed='        """Reset the list of log records and the captured log text."""\n'
                "        self.handler.clear()\n",
                base='        """Reset the list of log records and the captured log text."""\n'
                "        self.handler.reset()\n",
            ),
        ],
        test=[
            Edit(
                "testing/logging/test_fixture.py",
                fixed="def test_clear_for_call_stage(caplog, logging_during_setup_and_teardown):\n"
                '    logger.info("a_call_log")\n'
                '    assert [x.message for x in caplog.get_records("call")] == ["a_call_log"]\n'
                '    assert [x.message for x in caplog.get_records("setup")] == ["a_setup_log"]\n'
                '    assert set(caplog._item.stash[caplog_records_key]) == {"setup", "call"}\n\n'
                "    caplog.clear()\n\n"
                '    assert caplog.get_records("call") == []\n'
                '    assert [x.message for x in caplog.get_records("setup")] == ["a_setup_log"]\n'
                '    assert set(caplog._item.stash[caplog_records_key]) == {"setup", "call"}\n\n'
                '    logging.info("a_call_log_after_clear")\n'
                '    assert [x.message for x in caplog.get_records("call")] == ["a_call_log_after_clear"]\n'
                '    assert [x.message for x in caplog.get_records("setup")] == ["a_setup_log"]\n'
                '    assert set(caplog._item.stash[caplog_records_key]) == {"setup", "call"}\n\n\n'
                "def test_ini_controls_global_log_level(",
                base="def test_ini_controls_global_log_level(",
            )
        ],
        drop=["doc", "changelog"],
        test_directives=["testing/logging/test_fixture.py"],
        requirements=[
            "attrs==22.1.0",
            "iniconfig==1.1.1",
            "packaging==21.3",
            "pyparsing==3.0.9",
            "pluggy==1.0.0",
        ],
        env={"PYTHONPATH": "{testbed}/src"},
    ),
]


def fetch_sdist(spec: Spec) -> Path:
    """Download (once) and checksum the release sdist."""
    dest = cache_root() / "sdists"
    path = dest / spec.sdist_file
    if not path.exists():
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-binary",
                ":all:",
                "--no-deps",
                "-q",
                "-d",
                str(dest),
                spec.sdist,
            ],
            check=True,
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != spec.sha256:
        raise SystemExit(f"{spec.sdist_file}: sha256 {digest} != pinned {spec.sha256}")
    return path


def apply_edits(tree: Path, edits: list[Edit], *, to_base: bool) -> None:
    for e in edits:
        f = tree / e.path
        text = f.read_text()
        old, new = (e.fixed, e.base) if to_base else (e.base, e.fixed)
        if text.count(old) != 1:
            raise SystemExit(f"{e.path}: expected exactly one occurrence of {old[:60]!r}")
        f.write_text(text.replace(old, new))


def diff_of(tree: Path, edits: list[Edit]) -> str:
    apply_edits(tree, edits, to_base=False)
    out = git(tree, "diff", "--binary", "--no-color").stdout.decode()
    git(tree, "checkout", "--", ".")
    return out


def build(spec: Spec, out_root: Path) -> Task:
    sdist = fetch_sdist(spec)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        (top,) = Path(tmp).iterdir()
        for rel in spec.drop:
            shutil.rmtree(top / rel)
        apply_edits(top, spec.gold + spec.test + spec.doc, to_base=True)
        out_dir = out_root / spec.instance_id
        out_dir.mkdir(parents=True, exist_ok=True)
        archive = out_dir / "base.tar.gz"
        deterministic_targz(top, archive)

        # Diff from the tree exactly as graders will materialise it (extracted archive, one commit).
        tree = Path(tmp) / "committed"
        tree.mkdir()
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        base_commit = init_single_commit(tree)
        gold_patch = diff_of(tree, spec.gold)
        test_patch = diff_of(tree, spec.test)

    task = Task(
        instance_id=spec.instance_id,
        repo=spec.repo,
        version=spec.version,
        base_commit=base_commit,
        problem_statement=spec.problem_statement,
        patch=gold_patch,
        test_patch=test_patch,
        FAIL_TO_PASS=[],
        PASS_TO_PASS=[],
        environment=TaskEnvironment(python=spec.python, requirements=spec.requirements, env=spec.env),
        test_directives=spec.test_directives,
        base_archive=str(archive),
    )
    ensure_task_env(task)
    try:
        f2p, p2p = derive_tests(task)
    except TaskDefect as e:
        raise SystemExit(str(e)) from e
    task.FAIL_TO_PASS, task.PASS_TO_PASS = f2p, p2p
    record = task.model_dump(mode="json")
    record["image"] = instance_image(spec.instance_id)  # the image SWE-bench publishes for it
    for unused in ("eval_script", "eval_type", "log_parser"):  # bundled rows grade from test_cmd
        if not record.get(unused):
            record.pop(unused, None)
    record["base_archive"] = archive.name
    record["source"] = {"sdist": spec.sdist, "file": spec.sdist_file, "sha256": spec.sha256}
    (out_dir / "task.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{spec.instance_id}: F2P={f2p} P2P={len(p2p)} archive={archive.stat().st_size}B")
    return task


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="instance ids to rebuild (default: all)")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "polar_env" / "tasks" / "bundled")
    args = ap.parse_args(argv)
    for spec in SPECS:
        if not args.only or spec.instance_id in args.only:
            build(spec, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

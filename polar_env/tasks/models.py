"""The task record: one SWE-bench-style instance, whatever set it came from.

Field names follow the SWE-bench dataset (`FAIL_TO_PASS`, `PASS_TO_PASS`, `patch`, `test_patch`, ...)
so a Verified row, a SWE-Gym JSONL row and a bundled task all load into the same model.
"""

from __future__ import annotations

import json
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from polar_env.tasks.harbor_config import HarborRef

DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
INSTANCE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


def patch_files(patch: str) -> list[str]:
    """Paths a unified git diff touches (new side), in order, without duplicates."""
    seen: dict[str, None] = {}
    for _, b in DIFF_HEADER.findall(patch):
        seen.setdefault(b, None)
    return list(seen)


class TaskEnvironment(BaseModel):
    """What the tests need to run: an interpreter version and exact pins (never ranges)."""

    model_config = ConfigDict(extra="forbid")

    python: str = "3.11"
    requirements: list[str] = Field(default_factory=list)
    # Extra variables for the test command, e.g. PYTHONPATH so the tree under test is imported
    # from /testbed instead of being pip-installed into the (read-only, shared) venv.
    env: dict[str, str] = Field(default_factory=dict)


# the key a file's rows carry for where they came from: a loader reads files beside them (SWE-bench Pro's
# run_scripts/); never a column of a dataset
ROWS_DIR = "polar_rows_dir"


class Task(BaseModel):
    """One instance. `base_archive` is set only for bundled tasks (a .tar.gz of the base tree)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    instance_id: str
    repo: str
    version: str = ""
    base_commit: str = ""
    problem_statement: str
    hints_text: str = ""
    patch: str = ""
    test_patch: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    environment: TaskEnvironment = Field(default_factory=TaskEnvironment)
    test_cmd: str = "python -m pytest -rA"
    test_directives: list[str] = Field(default_factory=list)
    image: str = ""  # the container image to run in; "" = the image SWE-bench publishes for the instance
    base_archive: str | None = None
    # SWE-bench's own evaluation columns (swebench 5 datasets carry them): when `eval_script` is set,
    # grading in the image runs exactly the script the `swebench` package builds from them.
    eval_script: str = ""
    log_parser: str = ""
    eval_type: str = ""
    workdir: str = "/testbed"  # where the repository is inside the image (datasets differ: /app, /<repo>)
    # the dataset loader (tasks/datasets/) that made the task: its procedure grades it ("": SWE-bench's)
    dataset: str = ""
    # every test's expected status, where the dataset's verdict wants them all (R2E-Gym's
    # expected_output_json: test name -> PASSED/FAILED/ERROR; FAIL_TO_PASS holds the PASSED ones), or its
    # statuses before the fix (Multi-SWE-bench's run and test-patch stages: test name -> "RUN/TEST")
    expected_statuses: dict[str, str] = Field(default_factory=dict)
    # files the dataset's procedure runs the tests with, from beside its rows (absolute path in the image ->
    # text: SWE-bench Pro's run_script.sh and parser.py), placed by the grader only
    grader_files: dict[str, str] = Field(default_factory=dict)
    # A Harbor task folder (tasks/harbor.py): graded by its own tests/test.sh, not by SWE-bench tests.
    harbor: HarborRef | None = None

    @field_validator("instance_id")
    @classmethod
    def _safe_id(cls, v: str) -> str:
        # It names cache dirs, temp dirs and images: no separators, no traversal, no hidden names.
        if not INSTANCE_ID_RE.match(v):
            raise ValueError(
                f"invalid instance_id {v!r}: letters, digits, '_', '.', '-' only, "
                "starting with a letter or digit"
            )
        return v

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, v: object) -> object:
        # The HF dataset stores these lists as JSON strings.
        return json.loads(v) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _defaults(self) -> Task:
        if not self.test_directives:
            self.test_directives = default_test_directives(self.repo, self.test_patch)
        return self

    @model_serializer(mode="wrap")
    def _drop_unset_sources(self, handler):  # type: ignore[no-untyped-def]
        # A SWE-bench row stays a SWE-bench row: the Harbor and image-layout fields appear only when set.
        data = handler(self)
        if isinstance(data, dict):
            if data.get("harbor") is None:
                data.pop("harbor", None)
            if data.get("workdir") == "/testbed":
                data.pop("workdir", None)
            for key in ("dataset", "expected_statuses", "grader_files"):
                if not data.get(key):
                    data.pop(key, None)
        return data

    def test_files(self) -> list[str]:
        """Files the test patch touches: reset to base before it is applied."""
        return patch_files(self.test_patch)

    def full_test_command(self) -> str:
        return " ".join([self.test_cmd, *self.test_directives])


def default_test_directives(repo: str, test_patch: str) -> list[str]:
    """Which tests to run, derived from the test patch the way SWE-bench does it."""
    files = [f for f in patch_files(test_patch) if not f.endswith((".json", ".txt", ".yml", ".yaml"))]
    if repo == "django/django":
        # Django's runner takes dotted module names relative to tests/.
        return [f.removeprefix("tests/").removesuffix(".py").replace("/", ".") for f in files]
    return files

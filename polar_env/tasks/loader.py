"""Load task sets: the bundled CI set, SWE-bench Verified (via `datasets`), or a JSONL file."""

from __future__ import annotations

import json
import os
from pathlib import Path

from polar_env.cache import cache_root
from polar_env.tasks.models import ROWS_DIR, Task

BUNDLED_DIR = Path(__file__).parent / "bundled"
TERMINAL_DIR = Path(__file__).parent / "terminal"  # Harbor task folders: terminal work, not SWE-bench
VERIFIED_DATASET = "princeton-nlp/SWE-bench_Verified"

# SWE-bench's test commands for the Verified repos whose runner is not plain pytest.
# Production grading runs inside the per-instance image, where these commands are valid.
VERIFIED_TEST_CMD = {
    "django/django": "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1",
    "sympy/sympy": "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose",
    "sphinx-doc/sphinx": "tox --current-env -epy39 -v --",
}


class TaskLoadError(RuntimeError):
    """A task set could not be loaded; the message says why and what to do."""


def load_tasks(spec: str) -> list[Task]:
    """`spec` is "bundled", "verified", "terminal" (the bundled Harbor tasks), a Harbor task folder (or a
    folder of them), or the path of a JSONL file of SWE-bench-style rows."""
    if spec == "bundled":
        return load_bundled()
    if spec == "verified":
        return load_verified()
    name, _, split = spec.partition(":")
    from polar_env.tasks.datasets import DATASETS

    if name in DATASETS:
        return load_dataset(name, split)
    path = TERMINAL_DIR if spec == "terminal" else Path(spec)
    if path.is_dir():
        from polar_env.tasks.harbor import HarborTaskError, load_harbor

        try:
            return load_harbor(path)
        except HarborTaskError as exc:
            raise TaskLoadError(str(exc)) from exc
    if path.is_file():
        return load_jsonl(path)
    if path.suffix in (".jsonl", ".json") or path.parent != Path("."):
        raise TaskLoadError(
            f"task file {spec} does not exist: pass an existing JSONL file, a Harbor task folder, "
            "'bundled', 'terminal' or 'verified'"
        )
    raise TaskLoadError(
        f"unknown task set {spec!r}: expected 'bundled', 'terminal', 'verified', a Harbor task folder or a "
        "JSONL file path"
    )


def load_bundled() -> list[Task]:
    tasks = []
    for task_json in sorted(BUNDLED_DIR.glob("*/task.json")):
        task = Task.model_validate_json(task_json.read_text())
        if task.base_archive:
            # Stored relative to the task's directory so the package can move.
            task.base_archive = str(task_json.parent / task.base_archive)
        tasks.append(task)
    if not tasks:
        raise TaskLoadError(f"no bundled tasks under {BUNDLED_DIR}; run scripts/build_bundled_tasks.py")
    return tasks


def load_jsonl(path: Path) -> list[Task]:
    tasks = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                task = _from_row({**json.loads(line), ROWS_DIR: str(path.parent)})
            except Exception as e:  # noqa: BLE001 - re-raised with the line that failed
                raise TaskLoadError(f"{path}:{lineno}: not a valid task row: {e}") from e
            if task.base_archive:  # relative to the task file, so a task set moves as a whole
                archive = path.parent / task.base_archive
                if not archive.is_file():
                    raise TaskLoadError(
                        f"{path}:{lineno}: base_archive {task.base_archive} not found "
                        f"(looked for {archive}; relative paths are relative to the task file)"
                    )
                task.base_archive = str(archive)
            tasks.append(task)
    from polar_env.tasks.datasets import notice_unreproduced

    notice_unreproduced(tasks)
    return tasks


def _from_row(row: dict) -> Task:
    from polar_env.tasks.datasets import detect

    if (dataset := detect(row)) is not None:  # a row in another dataset's own schema
        return dataset.to_task(row)
    row = {k: v for k, v in row.items() if k != ROWS_DIR}
    if "test_cmd" not in row and row.get("repo") in VERIFIED_TEST_CMD:
        row["test_cmd"] = VERIFIED_TEST_CMD[row["repo"]]
    return Task.model_validate(row)


def load_dataset(name: str, split: str = "") -> list[Task]:
    """``NAME[:split]`` of a dataset loader (tasks/datasets/): ``split`` may be a JSONL file of the
    dataset's rows; else the hub's split, through ``datasets`` (cached as JSONL like Verified)."""
    from polar_env.tasks.datasets import DATASETS, DatasetRowError, notice_unreproduced

    spec = DATASETS[name]
    if split.endswith((".jsonl", ".json")):
        rows = [{**row, ROWS_DIR: str(Path(split).parent)} for row in _jsonl_rows(Path(split))]
    else:
        rows = _hub_rows(spec.hub_name, split or spec.default_split, f"{name}-{split or spec.default_split}")
    tasks = []
    for lineno, row in enumerate(rows, 1):
        try:
            tasks.append(spec.to_task(row))
        except DatasetRowError as exc:
            raise TaskLoadError(f"{name} row {lineno}: {exc}") from exc
    notice_unreproduced(tasks)
    return tasks


def _jsonl_rows(path: Path) -> list[dict]:
    if not path.is_file():
        raise TaskLoadError(f"task file {path} does not exist")
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise TaskLoadError(f"{path}: not JSONL: {exc}") from exc


def _hub_rows(dataset: str, split: str, cache_name: str) -> list[dict]:
    """A hub dataset's rows through ``datasets``, also kept as JSONL in the Polar cache, so once
    loaded the set works offline (and without ``datasets``)."""
    cached = cache_root() / "tasks" / f"{cache_name}.jsonl"
    if cached.is_file():
        return _jsonl_rows(cached)
    try:
        import datasets
    except ImportError as e:
        raise TaskLoadError(f"loading {dataset} needs the `datasets` package: pip install datasets") from e
    try:
        ds = datasets.load_dataset(dataset, split=split)
    except Exception as e:  # noqa: BLE001 - datasets raises many types for "hub unreachable"
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"
        hint = (
            "HF_HUB_OFFLINE is set and the dataset is not in the local cache"
            if offline
            else "the Hugging Face hub is unreachable (or the split unknown) and the dataset is not in the "
            "local cache"
        )
        raise TaskLoadError(
            f"cannot load {dataset} split {split!r}: {hint} ({type(e).__name__}: {e}). "
            "Download it once on a machine with hub access (it is cached under $HF_HOME), "
            "or export its rows to JSONL and pass the file path; '--tasks bundled' works offline."
        ) from e
    rows = [dict(row) for row in ds]
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    tmp.rename(cached)
    return rows


def load_verified(split: str = "test") -> list[Task]:
    """SWE-bench Verified through `datasets` (cached as JSONL: then offline)."""
    cached = cache_root() / "tasks" / f"swe-bench-verified-{split}.jsonl"
    if cached.is_file():
        return load_jsonl(cached)
    return [_from_row(row) for row in _hub_rows(VERIFIED_DATASET, split, f"swe-bench-verified-{split}")]

"""SWE-Gym (``SWE-Gym/SWE-Gym``): SWE-bench's schema; OpenHands' images, ``__`` written ``_s_``.

Checked against the dataset card (huggingface.co/datasets/SWE-Gym/SWE-Gym: ``instance_id``,
``hints_text``, ``patch``, ``test_patch``, ``created_at``, ``problem_statement``, ``repo``, ``base_commit``,
``version``, ``PASS_TO_PASS``/``FAIL_TO_PASS`` as string sequences; 2438 rows, 11 Python repositories),
the README of github.com/SWE-Gym/SWE-Gym (images under ``xingyaoww/sweb.eval.x86_64``; the environment
constants in github.com/SWE-Gym/SWE-Bench-Fork) and OpenHands' ``get_instance_docker_image``:
``xingyaoww/sweb.eval.x86_64.<instance_id, __ as _s_>``, lower-cased. The repository is at ``/testbed``
(SWE-bench's layout); the test command is the fork's ``test_cmd`` for the repository plus SWE-bench's
test directives (the test patch's files), the log parser the fork's (pytest's, pydantic's own).

Its procedure is SWE-bench's eval script (the fork's ``make_eval_script_list``): the conda ``testbed``
environment activated, the test patch's files reset to the base commit, the test patch applied, the
tests run between the harness markers, the test files reset again; parsed by the fork's parser,
resolved when every FAIL_TO_PASS and PASS_TO_PASS test passes. A plain ``FILE.jsonl`` row is SWE-Gym's
when its repository is one of SWE-Gym's eleven (none of them is a SWE-bench repository) and it names
no image of its own (a row Polar wrote keeps its ``image`` and ``dataset``).
"""

from __future__ import annotations

from polar_env.tasks.datasets.base import CONDA_TESTBED, DatasetSpec, Procedure, field, make_task
from polar_env.tasks.models import Task

NAME = "swe-gym"

# SWE-Gym/SWE-Bench-Fork@242429c swebench/harness/constants.py: TEST_<REPO> of each SWE-Gym repository
# (one command for all its versions); anything else gets the fork's TEST_PYTEST.
TEST_CMD = {
    "getmoto/moto": "pytest -n0 -rA",
    "conan-io/conan": "pytest -n0 -rA",
    "dask/dask": "pytest -n0 -rA  --color=no",
    "project-monai/monai": "pytest -rA ",
    "iterative/dvc": "pytest -rA",
    "bokeh/bokeh": "pytest -rA -n0",
    "modin-project/modin": "pytest -n0 -rA",
    "pydantic/pydantic": "pytest -rA --tb=short -vv -o console_output_style=classic --no-header",
    "pandas-dev/pandas": "pytest -rA --tb=long",
    "facebookresearch/hydra": "pytest -rA --tb=long",
    "python/mypy": "pytest -n0 -rA -k",
}
DEFAULT_TEST_CMD = "pytest -rA"


def image(instance_id: str) -> str:
    return f"xingyaoww/sweb.eval.x86_64.{instance_id.replace('__', '_s_')}".lower()


def to_task(row: dict) -> Task:
    iid = field(row, "instance_id", dataset=NAME)
    repo = field(row, "repo", dataset=NAME)
    return make_task(
        NAME,
        instance_id=iid,
        repo=repo,
        version=str(row.get("version") or ""),
        base_commit=field(row, "base_commit", dataset=NAME),
        problem_statement=field(row, "problem_statement", dataset=NAME),
        hints_text=row.get("hints_text") or "",
        patch=field(row, "patch", dataset=NAME),
        test_patch=field(row, "test_patch", dataset=NAME),
        FAIL_TO_PASS=field(row, "FAIL_TO_PASS", list, dataset=NAME),
        PASS_TO_PASS=field(row, "PASS_TO_PASS", list, dataset=NAME),
        image=image(iid),
        workdir="/testbed",
        test_cmd=TEST_CMD.get(repo.lower(), DEFAULT_TEST_CMD),
        log_parser="parse_log_pytest_pydantic" if repo.lower() == "pydantic/pydantic" else "parse_log_pytest",
    )


def matches(row: dict) -> bool:
    return (
        str(row.get("repo", "")).lower() in TEST_CMD
        and "image" not in row
        and "dataset" not in row
        and "FAIL_TO_PASS" in row
    )


PROCEDURE = Procedure(
    activate=CONDA_TESTBED,
    verified="a stand-in image in SWE-Gym's layout (conda `testbed`, "
    "/testbed with a later fix commit), gold 1.0 and no-op 0 by `polar rollout`, strict mode "
    "(tests/tasks/test_dataset_standins.py)",
)
SPEC = DatasetSpec(NAME, "SWE-Gym/SWE-Gym", "train", matches=matches, to_task=to_task, procedure=PROCEDURE)

"""SWE-rebench (``nebius/SWE-rebench``, v1) and SWE-rebench V2 (``nebius/SWE-rebench-V2``).

v1, checked against github.com/SWE-rebench/SWE-bench-fork@39316f7 (the harness its card points to):
SWE-bench's columns plus ``install_config``, the row's own environment recipe that replaces SWE-bench's
per-repository specs; its ``test_cmd`` (a string) is the test command, to which the fork prefixes
``LANG=C.UTF-8 LC_ALL=C.UTF-8`` (here: the task's test environment) and appends SWE-bench's test
directives, and its ``log_parser`` names the
SWE-bench parser (``parse_log_pytest`` …). Images: ``test_spec.instance_image_key`` with the
``swerebench`` namespace, ``swerebench/sweb.eval.x86_64.<id lower-cased, __ as _1776_>`` (a row's
``docker_image``, where a dump carries one, wins); the repository at ``/testbed``.

V2, checked against github.com/SWE-rebench/SWE-rebench-V2@c71902a (``scripts/eval.py``, ``sample.json``,
``lib/agent/log_parsers.py``): the columns plus ``language`` (20 languages), ``interface``,
``pr_description``, ``meta``; the image is the row's top-level ``image_name``
(``docker.io/swerebenchv2/<owner>-<repo>:<number>-<sha7>``), the repository at ``/<repo name>``;
``install_config.test_cmd`` is a string or a list of commands (run in order under ``set -e``, no test
directives), ``install_config.log_parser`` names a parser of V2's own ``log_parsers.py``; a task
passes when the tests that PASSED are exactly FAIL_TO_PASS + PASS_TO_PASS (swe_rebench_v2_parsers.py).
"""

from __future__ import annotations

from polar_env.tasks.datasets.base import (
    CONDA_TESTBED,
    NO_DIRECTIVES,
    DatasetSpec,
    Procedure,
    field,
    make_task,
    raise_missing,
)
from polar_env.tasks.datasets.swe_rebench_v2_parsers import PARSERS as V2_PARSERS
from polar_env.tasks.datasets.swe_rebench_v2_parsers import resolves as v2_resolves
from polar_env.tasks.models import Task

NAME, NAME_V2 = "swe-rebench", "swe-rebench-v2"
# The fork's _clean_install_config prefixes "LANG=C.UTF-8 LC_ALL=C.UTF-8 " to test_cmd; here it is the test
# environment (exported before the tests), so test_cmd stays a pytest command Polar's strict mode can run.
LOCALE = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def image(instance_id: str) -> str:
    return f"swerebench/sweb.eval.x86_64.{instance_id.lower()}".replace("__", "_1776_")


def _common(row: dict, dataset: str) -> dict:
    return dict(
        instance_id=field(row, "instance_id", dataset=dataset),
        repo=field(row, "repo", dataset=dataset),
        version=str(row.get("version") or ""),
        base_commit=field(row, "base_commit", dataset=dataset),
        problem_statement=field(row, "problem_statement", dataset=dataset),
        hints_text=row.get("hints_text") or "",
        patch=field(row, "patch", dataset=dataset),
        test_patch=field(row, "test_patch", dataset=dataset),
        FAIL_TO_PASS=field(row, "FAIL_TO_PASS", list, dataset=dataset),
        PASS_TO_PASS=field(row, "PASS_TO_PASS", list, dataset=dataset),
    )


def _text(config: dict, key: str, dataset: str, iid: str) -> str:
    value = config.get(key)
    if not isinstance(value, str) or not value.strip():
        raise_missing(dataset, iid, f"install_config.{key}")
    return value


def to_task(row: dict) -> Task:
    config = field(row, "install_config", dict, dataset=NAME)
    common = _common(row, NAME)
    test_cmd = _text(config, "test_cmd", NAME, common["instance_id"])
    parser = _text(config, "log_parser", NAME, common["instance_id"])
    return make_task(
        NAME,
        **common,
        image=row.get("docker_image") or image(common["instance_id"]),
        workdir="/testbed",
        test_cmd=test_cmd,
        environment={"env": LOCALE},
        log_parser=parser,
    )


def to_task_v2(row: dict) -> Task:
    config = field(row, "install_config", dict, dataset=NAME_V2)
    common = _common(row, NAME_V2)
    iid = common["instance_id"]
    cmds = config.get("test_cmd")
    cmds = [cmds] if isinstance(cmds, str) else cmds
    cmds = [c for c in cmds if isinstance(c, str) and c.strip()] if isinstance(cmds, list) else []
    if not cmds:
        raise_missing(NAME_V2, iid, "install_config.test_cmd")
    parser = _text(config, "log_parser", NAME_V2, iid)
    return make_task(
        NAME_V2,
        **common,
        image=field(row, "image_name", dataset=NAME_V2),
        workdir="/" + common["repo"].split("/")[-1],
        test_cmd=" && ".join(cmds),
        test_directives=NO_DIRECTIVES,
        log_parser=parser,
    )


def _is_v2(row: dict) -> bool:
    return "install_config" in row and "image_name" in row


# the fork's eval script: SWE-bench's, conda ``testbed`` first (it also re-runs ``install_config.install``:
# not here)
PROCEDURE = Procedure(
    activate=CONDA_TESTBED,
    verified="a stand-in image in SWE-bench's layout (conda `testbed`, "
    "/testbed with a later fix commit), gold 1.0 and no-op 0 by `polar rollout`, strict mode "
    "(tests/tasks/test_dataset_standins.py)",
)
SPEC = DatasetSpec(
    NAME,
    "nebius/SWE-rebench",
    "test",
    to_task=to_task,
    procedure=PROCEDURE,
    matches=lambda row: "install_config" in row and not _is_v2(row),
)
# V2's eval.py: in /<repo>, the image's own Python (no activation), the row's commands in order, the whole
# log parsed by V2's parser (its Python ones here: a row naming another is not gradable), resolved when the
# tests that passed are exactly FAIL_TO_PASS + PASS_TO_PASS
SPEC_V2 = DatasetSpec(
    NAME_V2,
    "nebius/SWE-rebench-V2",
    "train",
    to_task=to_task_v2,
    matches=_is_v2,
    procedure=Procedure(
        parsers=V2_PARSERS,
        resolves=v2_resolves,
        verified="a stand-in image in V2's layout (/<repo>, the image's own Python, the base a reset "
        "clone with the fix in its objects), gold 1.0 and no-op 0 by `polar rollout`, strict mode "
        "(tests/tasks/test_dataset_standins.py)",
    ),
)

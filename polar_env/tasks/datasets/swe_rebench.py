"""SWE-rebench (``nebius/SWE-rebench``, v1) and SWE-rebench V2 (``nebius/SWE-rebench-V2``).

v1 rows are SWE-bench's columns plus ``install_config`` (the environment recipe; its ``test_cmd`` is
the test command) and, in newer dumps, ``docker_image``. Images: ``swerebench/sweb.eval.x86_64.<id
with __ as _1776_>`` (SWE-bench's naming under the ``swerebench`` namespace), repository at
``/testbed``, pytest's log parser. V2 (20 languages) keeps the columns, its ``install_config``
names ``test_cmd`` and ``log_parser``, the row names its ``docker_image`` and the repository sits at
``/<repo name>`` in it; only Python rows (``language``) are graded with a parser Polar has.
"""

from __future__ import annotations

from polar_env.tasks.datasets.base import DatasetRowError, DatasetSpec, field, make_task
from polar_env.tasks.models import Task

NAME, NAME_V2 = "swe-rebench", "swe-rebench-v2"


def image(instance_id: str) -> str:
    return f"swerebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_')}"


def _common(row: dict, dataset: str) -> dict:
    return dict(instance_id=field(row, "instance_id", dataset=dataset), repo=field(row, "repo", dataset=dataset),
                version=str(row.get("version") or ""), base_commit=field(row, "base_commit", dataset=dataset),
                problem_statement=field(row, "problem_statement", dataset=dataset),
                hints_text=row.get("hints_text") or "", patch=field(row, "patch", dataset=dataset),
                test_patch=field(row, "test_patch", dataset=dataset),
                FAIL_TO_PASS=field(row, "FAIL_TO_PASS", list, dataset=dataset),
                PASS_TO_PASS=field(row, "PASS_TO_PASS", list, dataset=dataset))


def to_task(row: dict) -> Task:
    config = field(row, "install_config", dict, dataset=NAME)
    common = _common(row, NAME)
    test_cmd = config.get("test_cmd")
    if not isinstance(test_cmd, str) or not test_cmd.strip():
        raise_field(NAME, common["instance_id"], "install_config.test_cmd")
    return make_task(NAME, **common, image=row.get("docker_image") or image(common["instance_id"]),
                     workdir="/testbed", test_cmd=test_cmd, log_parser="pytest")


def to_task_v2(row: dict) -> Task:
    config = field(row, "install_config", dict, dataset=NAME_V2)
    common = _common(row, NAME_V2)
    for key in ("test_cmd", "log_parser"):
        if not isinstance(config.get(key), str) or not config[key].strip():
            raise_field(NAME_V2, common["instance_id"], f"install_config.{key}")
    test_cmd = config["test_cmd"]
    return make_task(NAME_V2, **common, image=field(row, "docker_image", dataset=NAME_V2),
                     workdir="/" + common["repo"].rsplit("/", 1)[-1], test_cmd=test_cmd,
                     log_parser=config["log_parser"])


def raise_field(dataset: str, iid: str, name: str) -> None:
    raise DatasetRowError(f"{dataset} row {iid}: missing field {name!r}")


def _is_v2(row: dict) -> bool:
    return isinstance(row.get("install_config"), dict) and "log_parser" in row["install_config"]


SPEC = DatasetSpec(NAME, "nebius/SWE-rebench", "test", to_task=to_task,
                   matches=lambda row: "install_config" in row and not _is_v2(row))
SPEC_V2 = DatasetSpec(NAME_V2, "nebius/SWE-rebench-V2", "train", to_task=to_task_v2, matches=_is_v2)

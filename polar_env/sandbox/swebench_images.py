"""SWE-bench per-instance image names (the naming of swebench's own harness)."""

from __future__ import annotations


def swebench_image(instance_id: str, *, namespace: str = "swebench", arch: str = "x86_64",
                   tag: str = "latest") -> str:
    """``django__django-11099`` -> ``swebench/sweb.eval.x86_64.django_1776_django-11099:latest``.

    Docker Hub forbids ``__`` in repository names, so swebench writes it as ``_1776_``.
    """
    return f"{namespace}/sweb.eval.{arch}.{instance_id.replace('__', '_1776_').lower()}:{tag}"

"""Harness adapters: the only place that knows a harness (install, configure, run headless, summarize)."""

from polar_env.harness_adapters.base import HarnessAdapter, HarnessContext, HarnessSummary
from polar_env.harness_adapters.registry import adapter_names, get_adapter

__all__ = ["HarnessAdapter", "HarnessContext", "HarnessSummary", "adapter_names", "get_adapter"]

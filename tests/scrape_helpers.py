"""Test-side helpers: a Prometheus ``/metrics`` scrape, parsed by prometheus_client's own parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Scrape:
    """Every sample of a scrape: (name, sorted labels) -> value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(scrape: Scrape, name: str, **labels: str) -> float:
    """One sample's value (0 when the scrape has no such sample)."""
    return scrape.get((name, tuple(sorted(labels.items()))), 0.0)


def scrape(url: str) -> Scrape:
    with urllib.request.urlopen(url, timeout=30) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        return samples(resp.read().decode())

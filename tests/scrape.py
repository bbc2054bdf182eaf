"""Scraping a metrics endpoint the way Prometheus would, for tests.

Owns: one HTTP GET of ``/metrics`` parsed with prometheus_client's own parser, and lookups of
samples by name and labels. Must not: start processes or servers.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Scrape:
    """Every sample of one scrape: (sample name, sorted labels) -> value."""

    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]

    def value(self, name: str, **labels: object) -> float | None:
        return self.samples.get((name, tuple(sorted((k, str(v)) for k, v in labels.items()))))

    def labelled(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {labels: v for (n, labels), v in self.samples.items() if n == name}

    def names(self) -> set[str]:
        return {n for n, _ in self.samples}


def http_get(address: str, path: str = "/metrics") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=SCRAPE_TIMEOUT_S) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(address: str) -> Scrape:
    status, text = http_get(address)
    assert status == 200, f"scrape of {address}: HTTP {status}\n{text}"
    return Scrape({(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(text)
                   for s in family.samples})

"""The engine tests' fixture pages (fixtures/*.txt, written from each engine's documented metric definitions)
and one interval read from a pair of them."""

from __future__ import annotations

from pathlib import Path

from collectors.engines import EngineKind, EngineScraper
from sentinel.telemetry.serving import ServingStats

FIXTURES = Path(__file__).parent / "fixtures"


def page(name: str) -> str:
    return (FIXTURES / name).read_text()


def interval(kind: EngineKind, before: str, after: str) -> ServingStats:
    """What the scraper reports for the interval between two readings (the first only sets the baseline)."""
    scraper = EngineScraper(kind, "http://unused")
    assert scraper.from_text(before, now=1.0) is not None, scraper.last_error
    stats = scraper.from_text(after, now=2.0)
    assert stats is not None, scraper.last_error
    return stats


def without(text: str, metric: str) -> str:
    """The page with every line naming `metric` taken out."""
    return "\n".join(line for line in text.splitlines() if metric not in line) + "\n"

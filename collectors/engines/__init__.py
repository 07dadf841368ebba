"""Engine adapters: a serving engine's Prometheus `/metrics` page (vLLM, SGLang, NVIDIA Dynamo) read as
Sentinel's `ServingStats`, for replicas that run no Sentinel SDK.

`EngineScraper(kind, url)` binds the generic scraper (scrape.py) to one engine's names (vllm.py, sglang.py,
dynamo.py). Engines expose only marginal histograms, so `ServingStats.joint` stays empty.
"""

from __future__ import annotations

from typing import Literal

from collectors.engines import dynamo, sglang, vllm
from collectors.engines.scrape import EngineMap, Scraper
from sentinel.telemetry.serving import Stage

EngineKind = Literal["vllm", "sglang", "dynamo"]
ENGINES: dict[str, EngineMap] = {"vllm": vllm.MAP, "sglang": sglang.MAP, "dynamo": dynamo.MAP}


class EngineScraper(Scraper):
    """Scrapes one engine replica's `/metrics`: `scrape()` per interval, `from_text()` for a page in hand."""

    def __init__(self, kind: EngineKind, url: str, *, replica: str | None = None, stage: Stage = "mixed",
                 timeout_seconds: float = 2.0) -> None:
        if kind not in ENGINES:
            raise ValueError(f"unknown engine {kind!r}: one of {sorted(ENGINES)}")
        super().__init__(ENGINES[kind], url, replica=replica, stage=stage, timeout_seconds=timeout_seconds)
        self.kind: EngineKind = kind


__all__ = ["ENGINES", "EngineKind", "EngineScraper", "Scraper"]

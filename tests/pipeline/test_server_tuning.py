"""The interpreter settings a running server takes for its ingest path, and gives back when it stops."""

from __future__ import annotations

import gc
import sys

from fastapi.testclient import TestClient

from sentinel.app import GC_THRESHOLDS, SWITCH_INTERVAL_SECONDS
from tests.conftest import stop_app


def test_a_running_server_hands_the_gil_over_within_a_millisecond_and_restores_the_default_when_it_stops(
        client: TestClient) -> None:
    # The periodic sweeps hold the GIL on the scheduler's thread; the ingest writer gets it back within 1 ms
    # of asking (CPython's default is 5 ms, hundreds of times a batch).
    assert sys.getswitchinterval() == SWITCH_INTERVAL_SECONDS
    assert gc.get_threshold() == GC_THRESHOLDS
    stop_app(client)
    assert sys.getswitchinterval() == 0.005
    assert gc.get_threshold() != GC_THRESHOLDS

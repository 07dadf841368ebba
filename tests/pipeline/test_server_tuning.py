"""The interpreter settings a running server takes for its ingest path, and gives back when it stops."""

from __future__ import annotations

import gc
import sys

from fastapi.testclient import TestClient

from sentinel.app import GC_THRESHOLDS, SWITCH_INTERVAL_SECONDS, create_app
from sentinel.config import Settings
from tests.conftest import FakeClock


def test_a_running_server_hands_the_gil_over_within_a_millisecond_and_gives_back_what_it_found(
        settings: Settings, clock: FakeClock) -> None:
    # The periodic sweeps hold the GIL on the scheduler's thread; the ingest writer gets it back within 1 ms
    # of asking (CPython's default is 5 ms, hundreds of times a batch). Set here what the server finds, rather
    # than assume it: another test's server may have left its own values in this process.
    before_switch, before_gc = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(0.005)
    gc.set_threshold(700, 10, 10)
    try:
        with TestClient(create_app(settings, clock, run_scheduler=False)):
            assert sys.getswitchinterval() == SWITCH_INTERVAL_SECONDS
            assert gc.get_threshold() == GC_THRESHOLDS
        assert sys.getswitchinterval() == 0.005
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        sys.setswitchinterval(before_switch)
        gc.set_threshold(*before_gc)

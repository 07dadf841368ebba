"""Sentinel's dispatcher against a real Alertmanager: a trigger comes out of Alertmanager's webhook as a
firing alert with our labels and annotations, and a resolve as a resolved one."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sentinel.alerting import service
from sentinel.alerting.dispatcher import Dispatcher
from sentinel.clock import SystemClock, to_datetime
from sentinel.config import ReceiverConfig, Settings
from sentinel.db import transaction
from sentinel.incidents import render as prose
from sentinel.incidents.models import Incident
from tests.alerting.alerting_helpers import LoopbackReceiver, database, incident
from tests.live import free_port

pytestmark = pytest.mark.slow  # starts a real process (the marker's meaning in pyproject), though it takes ~1.5 s

BINARY = "prometheus-alertmanager"

CONFIG = """
route:
  receiver: hook
  group_by: ['fingerprint']
  group_wait: 100ms
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: {hook}
        send_resolved: true
"""


@pytest.fixture
def alertmanager_binary() -> str:
    path = shutil.which(BINARY)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{BINARY} is required in CI (apt-get install prometheus-alertmanager)")
        pytest.skip(f"{BINARY} not installed")
    return path


@pytest.fixture
def hook() -> Iterator[LoopbackReceiver]:
    with LoopbackReceiver() as rx:
        yield rx


@pytest.fixture
def alertmanager(alertmanager_binary: str, hook: LoopbackReceiver, tmp_path: Path) -> Iterator[str]:
    config = tmp_path / "alertmanager.yml"
    config.write_text(CONFIG.format(hook=hook.url + "/hook"))
    port = free_port()
    log = open(tmp_path / "alertmanager.log", "wb")  # noqa: SIM115 - the child writes it until stopped
    proc = subprocess.Popen([alertmanager_binary, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
                             "--cluster.listen-address=", f"--storage.path={tmp_path / 'am-data'}"],
                            stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            assert proc.poll() is None, (tmp_path / "alertmanager.log").read_text()[-2000:]
            try:
                if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "alertmanager did not become ready"
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def test_trigger_and_resolve_reach_alertmanager_webhook(alertmanager, hook, tmp_path):
    clock = SystemClock()  # Alertmanager compares endsAt with its own clock
    settings = Settings(data_dir=tmp_path, alert_resend_seconds=60,
                        receivers=[ReceiverConfig(name="am", kind="alertmanager", url=alertmanager)])
    with database(f"sqlite:///{tmp_path / 'sentinel.db'}") as factory:
        dispatcher = Dispatcher(factory, settings, clock)
        try:
            with transaction(factory) as session:
                item = incident(opened_at=to_datetime(clock.time()))
                session.add(item)
                session.flush()
                service.notify(session, item, "trigger", settings, to_datetime(clock.time()))
                incident_id, labels, headline = item.id, prose.labels(item), prose.headline(item)
            assert dispatcher.run_once() == 1

            [firing] = hook.wait_for(1, path="/hook")
            message = firing.json()
            assert message["status"] == "firing" and message["receiver"] == "hook"
            [alert] = message["alerts"]
            assert alert["labels"] == labels
            assert alert["annotations"]["summary"] == headline
            assert alert["annotations"]["what_to_check"].startswith("check `nvidia-smi -q`")
            assert alert["generatorURL"].endswith(f"/api/v1/incidents/{incident_id}")

            with transaction(factory) as session:
                resolved = session.get(Incident, incident_id)
                assert resolved is not None
                resolved.state, resolved.resolved_at = "resolved", to_datetime(clock.time())
                service.notify(session, resolved, "resolve", settings, to_datetime(clock.time()))
            assert dispatcher.run_once() == 1

            done = hook.wait_for(2, path="/hook")[1].json()
            assert done["status"] == "resolved"
            assert done["alerts"][0]["labels"]["fingerprint"] == labels["fingerprint"]
        finally:
            dispatcher.stop()

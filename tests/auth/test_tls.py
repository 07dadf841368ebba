"""`sentinel server` over HTTPS with a certificate made here by openssl: clients trust it through
SENTINEL_CA_BUNDLE and fail clearly without it; with `tls_ca_certs` the server also wants a client certificate."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sentinel.auth.tls import TLSConfigError, client_ssl_context
from sentinel.client import SentinelClient
from tests.live import free_port, sentinel_cmd

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the CA."""
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=sentinel-test-ca", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, ext in (("server", ["-extfile", "san.ext"]), ("client", [])):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN=sentinel-{name}", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "2", *ext, cwd=d)
    return d


def start_https(tmp_path: Path, pki: Path, *extra: str) -> Iterator[tuple[str, dict[str, str]]]:
    port = free_port()
    env = {**os.environ, "SENTINEL_DATA_DIR": str(tmp_path / "data"),
           "SENTINEL_DATABASE_URL": f"sqlite:///{tmp_path / 'sentinel.db'}"}
    env.pop("SENTINEL_CA_BUNDLE", None)
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen(sentinel_cmd("server", "--host", "127.0.0.1", "--port", str(port), "--tls-certfile",
                                         str(pki / "server.pem"), "--tls-keyfile", str(pki / "server.key"), *extra),
                            env=env, stdout=log, stderr=log)
    url = f"https://127.0.0.1:{port}"
    context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    context.load_cert_chain(str(pki / "client.pem"), str(pki / "client.key"))
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            try:
                if httpx.get(url + "/readyz", verify=context, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the HTTPS server did not become ready"
                time.sleep(0.1)
        yield url, env
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()


@pytest.fixture
def https_server(tmp_path: Path, pki: Path) -> Iterator[tuple[str, dict[str, str]]]:
    yield from start_https(tmp_path, pki)


def test_a_client_with_the_ca_bundle_succeeds_and_one_without_fails_clearly(https_server, pki, tmp_path,
                                                                             monkeypatch):
    url, env = https_server
    admin = (tmp_path / "data" / "admin-token").read_text().strip()
    monkeypatch.delenv("SENTINEL_CA_BUNDLE", raising=False)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        SentinelClient(url, admin).get("/nodes")
    monkeypatch.setenv("SENTINEL_CA_BUNDLE", str(pki / "ca.pem"))
    client = SentinelClient(url, admin)
    assert client.get("/nodes") == []
    client.close()  # an idle TLS keep-alive connection would hold the server's stop for seconds

    status = subprocess.run(sentinel_cmd("status", "--server", url, "--token", admin),
                            env={**env, "SENTINEL_CA_BUNDLE": str(pki / "ca.pem")}, capture_output=True, text=True,
                            timeout=60)
    assert status.returncode == 0, status.stderr
    refused = subprocess.run(sentinel_cmd("status", "--server", url, "--token", admin), env=env,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in refused.stderr
    with pytest.raises(httpx.HTTPError):  # plain HTTP to the TLS port is not served
        httpx.get(url.replace("https://", "http://") + "/healthz", timeout=5)


@pytest.mark.parametrize("workers", ["0", "2"])  # with edge workers, TLS is theirs (sentinel/edge/)
def test_with_tls_ca_certs_the_server_wants_a_client_certificate(tmp_path, pki, workers):
    for url, _ in start_https(tmp_path, pki, "--tls-ca-certs", str(pki / "ca.pem"), "--workers", workers):
        plain = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/healthz", verify=plain, timeout=5)
        context = client_ssl_context({"SENTINEL_CA_BUNDLE": str(pki / "ca.pem"),
                                      "SENTINEL_CLIENT_CERT": str(pki / "client.pem"),
                                      "SENTINEL_CLIENT_KEY": str(pki / "client.key")})
        assert httpx.get(url + "/healthz", verify=context, timeout=5).status_code == 200


def test_a_bad_bundle_is_a_clear_error(tmp_path):
    with pytest.raises(TLSConfigError, match=r"SENTINEL_CA_BUNDLE=.*missing\.pem"):
        client_ssl_context({"SENTINEL_CA_BUNDLE": str(tmp_path / "missing.pem")})

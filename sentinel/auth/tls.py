"""Client-side TLS: which certificates a Sentinel client trusts.

`SENTINEL_CA_BUNDLE` names a PEM file (a private CA, or a self-signed server certificate); without it the
system's trust store is used. `SENTINEL_CLIENT_CERT` (and `SENTINEL_CLIENT_KEY` when the key is a separate
file) is the certificate a client presents to a server that requires one (`tls_ca_certs`).
"""

from __future__ import annotations

import os
import ssl


class TLSConfigError(OSError):
    pass


def client_ssl_context(environ: dict[str, str] | None = None) -> ssl.SSLContext:
    """An SSLContext for httpx's `verify=`: default trust, or the bundle in SENTINEL_CA_BUNDLE."""
    env = os.environ if environ is None else environ
    bundle = env.get("SENTINEL_CA_BUNDLE") or None
    try:
        context = ssl.create_default_context(cafile=bundle)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"SENTINEL_CA_BUNDLE={bundle}: cannot load it as PEM certificates ({exc})") from exc
    cert = env.get("SENTINEL_CLIENT_CERT") or None
    if cert is not None:
        try:
            context.load_cert_chain(cert, env.get("SENTINEL_CLIENT_KEY") or None)
        except (OSError, ssl.SSLError) as exc:
            raise TLSConfigError(f"SENTINEL_CLIENT_CERT={cert}: cannot load the certificate and key ({exc})") from exc
    return context

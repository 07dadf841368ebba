"""`sentinel mcp` (stdio) and `sentinel mcp --http HOST:PORT` (Streamable HTTP): the MCP server for agents."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from sentinel.client import resolve_token
from sentinel.network.plan import split_address

log = logging.getLogger("sentinel.mcp")


def cmd_mcp(args: argparse.Namespace) -> int:
    from sentinel.mcp.server import Api, build, fixed_token, header_token

    server_url = (args.server or os.environ.get("SENTINEL_SERVER") or "http://127.0.0.1:9480").split(",")[0]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.http is None:
        token = resolve_token(args.token)
        if not token:
            print("sentinel mcp: no token (give --token, or set SENTINEL_TOKEN)", file=sys.stderr)
            return 2
        log.info("MCP server on stdio for Sentinel at %s", server_url)
        build(Api(server_url, fixed_token(token))).run("stdio")
        return 0
    address = split_address(args.http)
    if address is None:
        print(f"sentinel mcp: --http wants HOST:PORT with an IP address, not {args.http!r}", file=sys.stderr)
        return 2
    host, port = address
    log.info("MCP server on Streamable HTTP at http://%s:%d/mcp for Sentinel at %s (each request's own bearer "
             "token)", host, port, server_url)
    build(Api(server_url, header_token)).run("streamable-http", host=host, port=port)
    return 0


def add_parser(sub: Any, remote: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("mcp", help="the MCP server for agents: stdio, or Streamable HTTP with --http HOST:PORT")
    p.add_argument("--http", default=None, metavar="HOST:PORT",
                   help="serve Streamable HTTP at http://HOST:PORT/mcp (each request brings its own bearer token)")
    remote(p)
    p.set_defaults(fn=cmd_mcp)

"""`sentinel …` — one entry point for the server, the agent, and the operator's commands."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import httpx

from collectors import cli as collector_cli
from sentinel import cells
from sentinel.auth import cli as auth_cli
from sentinel.client import ApiError, SentinelClient, resolve_token
from sentinel.config import load_settings
from sentinel.console import human_bytes, table
from sentinel.diagnosis import cli as diagnosis_cli
from sentinel.grafana import cli as grafana_cli
from sentinel.incidents import cli as incidents_cli
from sentinel.mcp import cli as mcp_cli
from sentinel.network import cli as network_cli
from sentinel.policy import cli as policy_cli
from sentinel.serving.cli import serving_table
from sentinel.simulate import cli as simulate

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def _client(args: argparse.Namespace) -> SentinelClient:
    return SentinelClient(args.server, resolve_token(args.token))


def cmd_server(args: argparse.Namespace) -> int:
    import uvicorn

    from sentinel.app import create_app

    settings = load_settings(args.config, host=args.host, port=args.port, tls_certfile=args.tls_certfile,
                             tls_keyfile=args.tls_keyfile, tls_ca_certs=args.tls_ca_certs, workers=args.workers)
    logging.getLogger().setLevel(settings.log_level)
    if settings.tls_certfile is None and settings.host not in ("127.0.0.1", "::1", "localhost"):
        logging.getLogger("sentinel.server").warning(
            "listening on %s without TLS: bearer tokens cross the network in clear; set tls_certfile and "
            "tls_keyfile or put a TLS proxy in front (docs/security.md)", settings.host)
    app = create_app(settings)
    if settings.worker_count > 0:  # edge workers hold the connections; this process holds the state
        from sentinel.edge.server import run

        return run(app, settings, settings.worker_count, args.access_log)
    # a stop waits at most 5 s for open requests: long-polls (orders, commands) end as "nothing new" on it
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning", access_log=args.access_log,
                server_header=False, **{"timeout_graceful_shutdown": 5, **tls_options(settings)})
    return 0


def tls_options(settings: Any) -> dict[str, Any]:
    """uvicorn's TLS arguments from `tls_*` settings; with a CA file, clients must present a certificate."""
    if settings.tls_certfile is None:
        return {}
    import ssl

    options: dict[str, Any] = {"ssl_certfile": str(settings.tls_certfile),
                               "ssl_keyfile": str(settings.tls_keyfile) if settings.tls_keyfile else None}
    if settings.tls_ca_certs is not None:
        options |= {"ssl_ca_certs": str(settings.tls_ca_certs), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return options


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from sentinel.db import upgrade

    settings = load_settings(args.config)
    upgrade(settings.effective_database_url)
    print(f"schema is at head: {settings.effective_database_url.split('@')[-1]}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    if args.cells:  # several cells: one table with a CELL column (sentinel/cells.py)
        return cells.cmd_status(args)
    client = _client(args)
    nodes = client.get("/nodes")
    accelerators = client.get("/accelerators")
    jobs = client.get("/jobs", limit=20)
    by_state: dict[str, int] = {}
    for n in nodes:
        by_state[n["state"]] = by_state.get(n["state"], 0) + 1
    by_health: dict[str, int] = {}
    for a in accelerators:
        if a["present"]:
            by_health[a["health"]] = by_health.get(a["health"], 0) + 1
    print(f"server {client.server}: {len(nodes)} nodes, {sum(by_health.values())} accelerators, {len(jobs)} jobs\n")
    print(table(["STATE", "NODES"], sorted(by_state.items())) + "\n")
    print(table(["HEALTH", "ACCELERATORS"], sorted(by_health.items())) + "\n")
    per_node: dict[str, list[str]] = {}
    for a in accelerators:
        per_node.setdefault(a["node"], []).append(a["health"][0].upper() if a["present"] else "-")
    print(table(["NODE", "STATE", "LAST SEQ", "LAST SEEN", "ACCELERATORS (H healthy, S suspect, Q quarantined)"],
                [(n["name"], n["state"], n["last_seq"], (n["last_seen_at"] or "-")[:19],
                  "".join(per_node.get(n["name"], []))) for n in nodes]) + "\n")
    print(table(["JOB", "NAME", "KIND", "STATE", "WORLD"],
                [(j["id"], j["name"], j["kind"], j["state"], j["world_size"]) for j in jobs]))
    return 0


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}ms" if value < 10 else f"{value:.1f}s"


def _checkpoint_columns(policy: dict[str, Any] | None) -> tuple[str, str, str]:
    """Last committed step, what a save stalls the loop, and the observed vs recommended (Young/Daly) interval."""
    if not policy or policy["last_committed_step"] is None:
        return "-", "-", "-"
    recommended = policy["interval_recommended_seconds"]
    every = (f"{_secs(policy['interval_observed_seconds'])} "
             f"({'no MTBF yet' if recommended is None else _secs(recommended)})")
    return str(policy["last_committed_step"]), _secs(policy["stall_seconds"]), every


def cmd_jobs(args: argparse.Namespace) -> int:
    client = _client(args)
    jobs = client.get("/jobs", state=args.state, limit=args.limit)
    rows = []
    for j in jobs:
        m = client.get(f"/jobs/{j['id']}/metrics")
        tokens = "-" if m["tokens_per_second"] is None else f"{m['tokens_per_second']:,.0f}"
        memory = human_bytes(m["memory_peak_bytes"])
        if m["memory_capacity_bytes"]:
            memory += f" / {human_bytes(m['memory_capacity_bytes'])}"
        failures = f"{m['task_failures_total']}" + (f" ({m['failures_per_hour']:.2f}/h)" if m["failures_per_hour"]
                                                    else "")
        rows.append((j["id"], j["name"], j["kind"], j["state"], j["world_size"], _pct(m["mfu_ratio"]),
                     _pct(m["allreduce_time_ratio"]), f"{_secs(m['step_seconds_p50'])}/{_secs(m['step_seconds_p95'])}",
                     tokens, memory, failures, *_checkpoint_columns(client.get(f"/jobs/{j['id']}")["checkpoints"])))
    print(table(["JOB", "NAME", "KIND", "STATE", "WORLD", "MFU", "ALLREDUCE", "STEP p50/p95", "TOKENS/S",
                 "PEAK MEM", "FAILURES", "CKPT STEP", "CKPT STALL", "CKPT EVERY (REC.)"], rows))
    serving = serving_table(client, jobs)
    if serving:
        print(f"\nserving, over the server's window:\n{serving}")
    return 0


def cmd_inject(args: argparse.Namespace) -> int:
    argument = float(args.argument) if args.argument is not None else None
    command = _client(args).post(f"/nodes/{args.node}/inject", {"accelerator_index": args.accelerator,
                                                                 "fault": args.fault, "argument": argument})
    print(f"queued {command['id']}: {args.fault} on node {args.node} accelerator {args.accelerator} (simulated)")
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    from sentinel.launcher.launcher import Launcher

    argv = list(args.cmd)
    if argv and argv[0] == "--":
        argv = argv[1:]
    executor: Any = None
    if args.engine and not args.serve:
        raise SystemExit("sentinel launch: --engine needs --serve (the router gives each replica its port)")
    if args.serve:  # a serving job behind the router (sentinel/launcher/replicas.py)
        from functools import partial

        from sentinel.launcher.replicas import ServingProcesses
        from sentinel.serving.router import Router

        host, _, port = args.serve.rpartition(":")
        router = Router(host or "127.0.0.1", int(port), limit=args.batch_limit, slo=args.slo)  # slo: rush admission
        executor = partial(ServingProcesses, router=router, engine=args.engine)
    slo = dict(zip(("ttft_seconds", "tpot_seconds"), args.slo, strict=True)) if args.slo else None
    launcher = Launcher(_client(args), name=args.job, nproc=args.nproc, argv=argv, kind=args.kind,
                        nodes=args.node or [], warm=not args.cold, preload=args.preload, executor=executor,
                        attributes={"slo": slo} if slo else None)
    return launcher.run()


def cmd_health(args: argparse.Namespace) -> int:
    """quarantine / release an accelerator, cordon / uncordon a node."""
    client = _client(args)
    if args.command in ("quarantine", "release"):
        body: dict[str, Any] = {"reason": args.reason}
        if args.command == "quarantine":
            body["move_work"] = not args.keep_work
        for line in client.post(f"/accelerators/{args.target}/{args.command}", body):
            print(line)
    else:
        node = client.post(f"/nodes/{args.target}/{args.command}", {"reason": args.reason})
        print(f"node {node['name']} is {node['state']}")
    return 0


def cmd_breaker(args: argparse.Namespace) -> int:
    client = _client(args)
    state = client.post("/breaker/reset", {"reason": args.reason}) if args.reset else client.get("/breaker")
    print(f"circuit breaker: {'OPEN' if state['open'] else 'closed'}"
          + (f" since {state['opened_at'][:19]}Z — {state['reason']}" if state["open"] else ""))
    print(f"out of service in the last {state['window_seconds'] / 60:g} min: {state['taken_in_window']} of "
          f"{state['accelerators']} accelerators (limit {state['limit']:g})")
    if state["reset_by"]:
        print(f"last reset by {state['reset_by']} at {(state['reset_at'] or '')[:19]}Z")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from sentinel.demo.demo import run_demo

    return run_demo(data_dir=Path(args.data_dir) if args.data_dir else None, port=args.port, fault=args.fault,
                    exit_after=args.exit, duration=args.duration, serving=args.serving)


def _remote(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", default=None, help="server URL, or several comma-separated (a leader and its standbys); "
                        "default $SENTINEL_SERVER or http://127.0.0.1:9480")
    p.add_argument("--token", default=None, help="bearer token (default $SENTINEL_TOKEN or the local admin token)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sentinel", description=__doc__)
    parser.add_argument("--config", default=None, help="TOML file with a [sentinel] table")
    sub = parser.add_subparsers(dest="command", required=True)
    _server_parsers(sub)
    auth_cli.add_parsers(sub, _remote)  # token create|list|revoke, audit
    collector_cli.add_parser(sub)
    _read_parsers(sub)
    incidents_cli.add_parsers(sub, _remote)
    policy_cli.add_parsers(sub, _remote)  # policy decisions|shadow
    network_cli.add_parsers(sub, _remote)  # network [matrix|nics]
    diagnosis_cli.add_parser(sub, _remote)  # diagnose JOB [--run]
    mcp_cli.add_parser(sub, _remote)  # mcp [--http HOST:PORT]
    grafana_cli.add_parser(sub, _remote)
    simulate.add_parser(sub, _remote)
    _launch_parser(sub)
    _operator_parsers(sub)
    _demo_parser(sub)
    return parser


def _server_parsers(sub: Any) -> None:
    p = sub.add_parser("server", help="run the central service")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--access-log", action="store_true")
    p.add_argument("--workers", type=_workers, default=None,
                   help="edge worker processes holding the HTTP connections in front of the core: N or auto "
                        "(one per core less one); 0, the default, serves HTTP in the one process")
    p.add_argument("--tls-certfile", default=None, help="serve HTTPS with this PEM certificate (chain)")
    p.add_argument("--tls-keyfile", default=None, help="its private key (PEM)")
    p.add_argument("--tls-ca-certs", default=None, help="require client certificates signed by this CA (PEM)")
    p.set_defaults(fn=cmd_server)
    db = sub.add_parser("db", help="database schema").add_subparsers(dest="db_command", required=True)
    db.add_parser("upgrade", help="apply migrations").set_defaults(fn=cmd_db_upgrade)


def _read_parsers(sub: Any) -> None:
    p = sub.add_parser("status", help="the fleet as tables")
    _remote(p)
    cells.add_arguments(p)
    p.set_defaults(fn=cmd_status)
    p = sub.add_parser("jobs", help="registered jobs")
    _remote(p)
    p.add_argument("--state", default=None)
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(fn=cmd_jobs)


def _address(text: str) -> str:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return text


def _workers(text: str) -> int | str:
    if text == "auto":
        return text
    if not text.isdigit() or int(text) > 64:
        raise argparse.ArgumentTypeError(f"expected a number of workers (0 to 64) or auto, got {text!r}")
    return int(text)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, got {text!r}")
    return int(text)


def _slo(text: str) -> tuple[float, float]:
    try:
        ttft, tpot = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TTFT,TPOT in seconds (e.g. 0.5,0.05), got {text!r}") from None
    if not (0 < ttft < 3600 and 0 < tpot < 3600):
        raise argparse.ArgumentTypeError(f"SLO targets must be over 0 s and under an hour, got {text!r}")
    return ttft, tpot


def _launch_parser(sub: Any) -> None:
    p = sub.add_parser("launch", help="run a job's ranks here and carry out Sentinel's orders",
                       usage="sentinel launch --job NAME --nproc N [options] -- python train.py ...")
    _remote(p)
    p.add_argument("--job", required=True, help="job name")
    p.add_argument("--nproc", type=int, required=True, help="ranks (world size)")
    p.add_argument("--kind", default="training", choices=["training", "serving"])
    p.add_argument("--node", action="append", help="place only on these nodes (their agents run here)")
    p.add_argument("--cold", action="store_true", help="no warm standbys: every restart starts fresh processes")
    p.add_argument("--preload", action="append",
                   help="module standbys import ahead; repeat (default: torch, torch.distributed, DDP, torch._dynamo)")
    p.add_argument("--serve", metavar="HOST:PORT", type=_address, help="serving: each rank a replica, behind a router")
    p.add_argument("--batch-limit", type=_positive_int, help="serving: requests admitted per replica at once")
    p.add_argument("--engine", choices=["vllm", "sglang", "dynamo"],
                   help="serving: the replicas' engine; the node's agent scrapes each one's /metrics and canaries it")
    p.add_argument("--slo", metavar="TTFT,TPOT", type=_slo, help="serving: the SLO's targets in seconds, e.g. 0.5,0.05")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command of one rank, after --")
    p.set_defaults(fn=cmd_launch)


def _operator_parsers(sub: Any) -> None:
    for name, doc in (("quarantine", "take an accelerator out of service (and move its work)"),
                      ("release", "put a repaired accelerator back in service"),
                      ("cordon", "stop new work landing on a node"), ("uncordon", "let a node take work again")):
        p = sub.add_parser(name, help=doc)
        _remote(p)
        p.add_argument("target", help="accelerator uuid" if name in ("quarantine", "release") else "node name")
        p.add_argument("--reason", default="")
        if name == "quarantine":
            p.add_argument("--keep-work", action="store_true", help="do not restart the jobs on it elsewhere")
        p.set_defaults(fn=cmd_health)
    p = sub.add_parser("breaker", help="the circuit breaker: state, or --reset")
    _remote(p)
    p.add_argument("--reset", action="store_true")
    p.add_argument("--reason", default="")
    p.set_defaults(fn=cmd_breaker)
    p = sub.add_parser("inject", help="fault drill on a simulated accelerator")
    _remote(p)
    p.add_argument("--node", required=True)
    p.add_argument("--accelerator", type=int, required=True, help="accelerator index on the node")
    p.add_argument("fault", choices=["xid", "ecc", "thermal", "hang", "slow", "offline", "clear"])
    p.add_argument("argument", nargs="?", default=None, help="XID code for xid, factor for slow")
    p.set_defaults(fn=cmd_inject)


def _demo_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="the whole story: server, two agents, a DDP job, a fault, the recovery")
    p.add_argument("--data-dir", default=None, help="default: a fresh temporary directory")
    p.add_argument("--port", type=int, default=9480)
    p.add_argument("--fault", default=None, help="xid[:N] (default xid:79), hang or crash; serving: freeze (default), "
                        "empty or exit0")
    p.add_argument("--serving", action="store_true", help="a serving job behind the router, a replica fault, failover")
    p.add_argument("--exit", action="store_true", help="stop at the end instead of running until Ctrl-C")
    p.add_argument("--duration", type=float, default=None, help="keep running this many seconds, then stop")
    p.set_defaults(fn=cmd_demo)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    for noisy in ("httpx", "apscheduler", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    fn: Any = args.fn
    try:
        return int(fn(args))
    except ApiError as exc:
        print(f"error: the server answered {exc.status}: {exc.detail}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(f"error: cannot reach the server: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

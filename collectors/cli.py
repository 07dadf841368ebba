"""`sentinel collector`: the node agent's command (its options, its start and its bounded stop)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from sentinel.config import load_settings


def cmd_collector(args: argparse.Namespace) -> int:
    from collectors.agent import Agent, AgentConfig

    token = args.token or os.environ.get("SENTINEL_TOKEN")
    if args.token_file:
        token = Path(args.token_file).read_text().strip()
    if not token:
        print("error: an agent token is needed (--token, --token-file or SENTINEL_TOKEN)", file=sys.stderr)
        return 2
    host, _, port = args.listen.rpartition(":")
    labels = dict(item.partition("=")[::2] for item in args.label or [])
    if any(not k for k in labels):
        print("error: --label takes KEY=VALUE", file=sys.stderr)
        return 2
    sources = [f"rdma:{args.sysfs_root}" if s == "rdma" and args.sysfs_root else s for s in args.source or ["host"]]
    state_dir = Path(args.state_dir) if args.state_dir else load_settings().data_dir / "agent"
    config = AgentConfig(server_url=args.server, token=token, node=args.node_name, sources=sources, labels=labels,
                         interval_seconds=args.interval, listen_host=host or "127.0.0.1", listen_port=int(port),
                         state_dir=state_dir, spool_max_reports=args.spool_max, probe_listen=args.probe,
                         probe_interval_seconds=args.probe_interval, engines=args.engine or [],
                         canary_seconds=args.canary_seconds)
    agent = Agent(config)
    bound = agent.serve_http()
    agent.start()
    logging.getLogger("sentinel.agent").info(
        "agent started: node=%s server=%s sources=%s interval=%gs metrics=http://%s:%d/metrics spool=%s",
        config.node, config.server_url, ",".join(s.name for s in agent.sources), config.interval_seconds,
        config.listen_host, bound, agent.spool.directory)
    # SIGINT as SIGTERM: a KeyboardInterrupt raised wherever the main thread is (inside a lock it holds) can
    # leave the stop waiting on that lock for ever.
    signal.signal(signal.SIGTERM, lambda *_: agent._stop.set())
    signal.signal(signal.SIGINT, lambda *_: agent._stop.set())
    agent.run_forever()
    _stop_within(agent.stop, seconds=20.0)
    return 0


def _stop_within(stop: Any, seconds: float) -> None:
    """Run `stop`; if it has not returned in `seconds`, print every thread's stack (what it waits on) and exit
    1, so a stuck stop says why instead of hanging the node's shutdown."""
    import faulthandler
    import threading

    done = threading.Event()

    def watchdog() -> None:
        if not done.wait(seconds):
            logging.getLogger("sentinel.agent").error("agent did not stop in %gs; its threads:", seconds)
            faulthandler.dump_traceback(all_threads=True)
            os._exit(1)
    threading.Thread(target=watchdog, name="sentinel-agent-stop-watchdog", daemon=True).start()
    stop()
    done.set()


def add_parser(sub: Any) -> None:
    p = sub.add_parser("collector", help="run the node agent")
    p.add_argument("--server", default=os.environ.get("SENTINEL_SERVER", "http://127.0.0.1:9480"),
                   help="server URL, or several comma-separated; the agent fails over between them")
    p.add_argument("--token", default=None)
    p.add_argument("--token-file", default=None)
    p.add_argument("--node-name", default=os.uname().nodename)
    p.add_argument("--source", action="append", help="host, nvml, rdma or sim:N; repeat for several")
    p.add_argument("--sysfs-root", default=None, metavar="DIR",
                   help="where the rdma source reads sysfs (DIR stands for /sys: DIR/class/infiniband/…)")
    p.add_argument("--probe", default=None, metavar="HOST:PORT",
                   help="take part in the probe mesh: answer UDP probes here and probe the peers the server assigns")
    p.add_argument("--probe-interval", type=float, default=1.0, help="seconds between probes of each peer")
    p.add_argument("--label", action="append", metavar="KEY=VALUE",
                   help="a node label, e.g. rack=r7 or switch=leaf3 (failure domains); repeat for several")
    p.add_argument("--engine", action="append", metavar="JOB/RANK=KIND@URL[#REPLICA[:STAGE]]",
                   help="a vLLM, SGLang or Dynamo /metrics page speaking for a serving task; repeat for several")
    p.add_argument("--canary-seconds", type=float, default=15.0, help="seconds between canaries per --engine (0: none)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between reports")
    p.add_argument("--listen", default="127.0.0.1:9481", help="address of the agent's /metrics")
    p.add_argument("--state-dir", default=None, help="spool and seq (default: <data dir>/agent)")
    p.add_argument("--spool-max", type=int, default=10_000, help="reports kept on disk while the server is away")
    p.set_defaults(fn=cmd_collector)

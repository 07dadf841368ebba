"""Network routes: the probe-mesh matrix with its localisation, and the RDMA ports the agents report."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from sentinel.auth.deps import READ, allow
from sentinel.deps import Live, ServerClock, ServerSettings
from sentinel.network.localise import bad_now
from sentinel.network.schemas import LocalisationOut, MatrixOut, NicOut, PairOut

router = APIRouter(prefix="/network", tags=["network"])
NodeName = Annotated[str | None, Query(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")]


@router.get("/matrix", response_model=MatrixOut, dependencies=[Depends(allow(READ))])
def matrix(live: Live, clock: ServerClock, settings: ServerSettings, node: NodeName = None,
           window: Annotated[float | None, Query(gt=0, le=3600)] = None,
           limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000) -> MatrixOut:
    """Every probed ordered pair over the window (`window` seconds, default probe_window_seconds; `node`: only
    pairs with that node at one end), bad pairs first, and the localisation: slow links, bad nodes, bad
    domains, or fleet-wide."""
    net, now = live.network, clock.time()
    found, pairs = net.snapshot(now)
    if window is not None:
        pairs = net.matrix.pairs(now, window)
    if node is not None:
        pairs = [p for p in pairs if node in (p.source, p.target)]
    out = [PairOut(source=p.source, target=p.target, sent=p.sent, received=p.received, loss_ratio=p.loss_ratio,
                   rtt_p50_seconds=p.rtt_p50_seconds, rtt_p99_seconds=p.rtt_p99_seconds, last_at=p.last_at,
                   bad=bad_now(p, found.baseline_rtt_seconds, net.thresholds)) for p in pairs]
    out.sort(key=lambda p: (not p.bad, -(p.rtt_p50_seconds or 0.0), p.source, p.target))
    return MatrixOut(window_seconds=window or net.matrix.window_seconds, participants=net.plan.participants(),
                     peers_per_node=net.plan.peers, round_seconds=net.plan.round_seconds, pairs=out[:limit],
                     localisation=LocalisationOut.model_validate(asdict(found)),
                     excluded=net.excluded(now) if settings.network_exclude_slow_nodes else {})


@router.get("/nics", response_model=list[NicOut], dependencies=[Depends(allow(READ))])
def nics(live: Live, node: NodeName = None) -> list[NicOut]:
    """Every RDMA port as its node's latest report gave it (the `rdma` source), by node."""
    return [NicOut(node=p.node, device=p.port.device, port=p.port.port, state=p.port.state,
                   phys_state=p.port.phys_state, link_layer=p.port.link_layer,
                   rate_bytes_per_second=p.port.rate_bytes_per_second, link_flaps_total=p.port.link_flaps_total,
                   counters=p.port.counters, rates=p.port.rates, saturated=p.port.saturated, reported_at=p.at)
            for p in live.network.nics.ports(node)]

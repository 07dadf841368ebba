"""What the network routes answer (GET /api/v1/network/matrix, /network/nics)."""

from __future__ import annotations

from pydantic import BaseModel


class PairOut(BaseModel):
    source: str
    target: str
    sent: int
    received: int
    loss_ratio: float
    rtt_p50_seconds: float | None
    rtt_p99_seconds: float | None
    last_at: float
    bad: bool


class LinkOut(BaseModel):
    a: str
    b: str
    rtt_seconds: float | None
    loss_ratio: float
    confident: bool


class BadNodeOut(BaseModel):
    node: str
    bad_peers: int
    measured_peers: int
    unreachable: bool


class BadDomainOut(BaseModel):
    label: str
    value: str
    bad_nodes: list[str]
    nodes: int


class LocalisationOut(BaseModel):
    baseline_rtt_seconds: float | None
    pairs: int
    bad_pairs: int
    fleet_wide: bool
    links: list[LinkOut]
    nodes: list[BadNodeOut]
    domains: list[BadDomainOut]


class MatrixOut(BaseModel):
    """The probe mesh over the window: every probed ordered pair, and where the localisation puts a fault."""

    window_seconds: float
    participants: dict[str, str]  # node → probe address
    peers_per_node: int
    round_seconds: float
    pairs: list[PairOut]
    localisation: LocalisationOut
    excluded: dict[str, str]  # nodes out of placement (network_exclude_slow_nodes) and why; {} when off


class NicOut(BaseModel):
    node: str
    device: str
    port: int
    state: str | None
    phys_state: str | None
    link_layer: str | None
    rate_bytes_per_second: float | None
    link_flaps_total: int
    counters: dict[str, int]
    rates: dict[str, float]
    saturated: list[str]
    reported_at: float

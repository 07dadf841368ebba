"""Settings: parse (environment `SENTINEL_*`, optional TOML file) → defaults → validate."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# Receivers and their routes, from the `[[sentinel.receivers]]` tables of the config file (or
# `SENTINEL_RECEIVERS` as JSON). Routing is a filter per receiver: severity and label matchers (alerting/service.py).
ReceiverKind = Literal["alertmanager", "webhook", "slack", "pagerduty"]


class ReceiverConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    kind: ReceiverKind
    # alertmanager: base URL (…/api/v2/alerts is appended); webhook / slack: the full URL;
    # pagerduty: the Events API v2 URL (default https://events.pagerduty.com/v2/enqueue)
    url: str = ""
    # webhook: HMAC-SHA256 key; pagerduty: routing (integration) key. Either directly or from an env var.
    secret: str = Field(default="", repr=False)
    secret_env: str = ""
    min_severity: Literal["info", "warning", "critical"] = "warning"
    # every matcher must equal the incident's label (detector, layer, node, job, severity, …); "a|b" = either
    match: dict[str, str] = {}
    send_resolved: bool = True
    timeout_seconds: float = Field(default=5.0, gt=0, le=60)

    @model_validator(mode="after")
    def _complete(self) -> ReceiverConfig:
        if self.kind != "pagerduty" and not self.url:
            raise ValueError(f"receiver {self.name!r} ({self.kind}) needs a url")
        if self.kind == "pagerduty" and not self.url:
            self.url = "https://events.pagerduty.com/v2/enqueue"
        if self.kind == "pagerduty" and not self.resolved_secret():
            raise ValueError(f"receiver {self.name!r} (pagerduty) needs a routing key in secret or secret_env")
        return self

    def resolved_secret(self) -> str:
        if self.secret_env:
            return os.environ.get(self.secret_env, "")
        return self.secret


# where the training writes the learned policy's model (sentinel.policy.hazard.DEFAULT_PATH; not imported here:
# the settings load without numpy)
LEARNED_POLICY_PATH = Path(__file__).parent / "policy" / "learned.json"


def default_data_dir() -> Path:
    """A per-user data directory, following XDG where it is set."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "sentinel"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SENTINEL_", extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str = Field(default="", repr=False)  # may carry a password: never in a repr or a log
    host: str = "127.0.0.1"
    port: int = Field(default=9480, ge=0, le=65535)
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    # Edge workers (sentinel/edge/): processes that hold the HTTP connections (parsing, TLS, keep-alive) in
    # front of the one process that holds the state. 0: that process serves HTTP itself; "auto": one per core
    # the server may use, less the core's own.
    workers: int | Literal["auto"] = Field(default=0)
    # Per-token request rate (token bucket); a token's own `rate_limit_per_second` wins. 0 disables.
    rate_limit_per_second: float = Field(default=20.0, ge=0)
    rate_limit_burst: float = Field(default=200.0, ge=0)
    # TLS for `sentinel server` (docs/security.md); with tls_ca_certs, clients must show a certificate it signed.
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    tls_ca_certs: Path | None = None
    # Liveness: a node is down after this many of its own intervals without a report.
    missed_intervals_down: int = Field(default=3, ge=1)
    liveness_check_seconds: float = Field(default=1.0, gt=0)
    liveness_flush_seconds: float = Field(default=5.0, gt=0)
    # Receipts make ingest idempotent on (node, seq); older ones are pruned.
    receipt_retention_seconds: float = Field(default=24 * 3600.0, gt=0)
    window_samples: int = Field(default=60, ge=1, le=10_000)
    metrics_require_token: bool = True
    # Detection (DESIGN §4): the fault catalog is data; a file here replaces the built-in one.
    fault_catalog_file: Path | None = None
    detection_interval_seconds: float = Field(default=2.0, gt=0)
    disabled_detectors: list[str] = []
    # per-detector tunables, e.g. {"straggler": {"margin": 0.25}}; each detector documents its own
    detector_options: dict[str, dict[str, float]] = {}
    # An incident whose condition cleared is resolved only after it stays clear this long.
    resolve_after_seconds: float = Field(default=60.0, ge=0)
    # When this share of a detector's subjects (and at least this many) trip at once: one fleet-wide incident.
    fleet_wide_share: float = Field(default=0.25, gt=0, le=1)
    fleet_wide_min_findings: int = Field(default=3, ge=2)
    # A rank is hung after no step progress, while its process lives, for max(hang_min_seconds (the floor),
    # hang_step_factor × its own step (the median, or its wall time per step where that is longer), 1.5 × its
    # slowest recent step, 1.25 report intervals + the SDK's 1 s flush (fresher data does not exist)). Before its
    # first step: hang_startup_seconds. While a rank says it is paused (a checkpoint, an evaluation: SDK
    # `pause()`) its job waits on it for up to hang_pause_seconds. A rank that exits 0 while its peers still wait
    # hang_exit_grace_seconds later is a failure; until then the peers may be finishing (detectors/hang.py).
    hang_min_seconds: float = Field(default=1.0, gt=0)
    hang_step_factor: float = Field(default=10.0, gt=1)
    hang_startup_seconds: float = Field(default=600.0, gt=0)
    hang_pause_seconds: float = Field(default=1800.0, gt=0)
    hang_exit_grace_seconds: float = Field(default=60.0, gt=0)
    # Remediation (DESIGN §4, §6): quarantine, drain, move work. Dry run records what it would do.
    remediation_enabled: bool = True
    remediation_dry_run: bool = False
    # The batching controller (sentinel/serving/batching.py): serving jobs' batch limits against their SLO
    batching_interval_seconds: float = Field(default=2.0, ge=0)  # 0: off
    batching_dry_run: bool = False  # say what it would change, issue no adjust order
    executors: list[str] = []  # beyond orders to launchers: "slurm", "kubernetes"
    executor_options: dict[str, dict[str, Any]] = {}
    # Placement ("best-fit" | "learned") and checkpoint interval ("young-daly" | "learned") policies, or plugins.
    # A shadow is evaluated beside the active one at each decision and recorded next to it, never acted on
    # (sentinel/policy/, docs/operator-guide.md "Placement and checkpoint-interval policies, shadow mode").
    placement_policy: str = "best-fit"
    placement_shadow: str = ""
    checkpoint_interval_policy: str = "young-daly"
    checkpoint_interval_shadow: str = ""
    learned_policy_path: Path = LEARNED_POLICY_PATH  # the learned policy's hazard model (JSON)
    policy_decision_retention_days: float = Field(default=30.0, gt=0)  # older decisions are pruned hourly
    max_migrations_per_hour: int = Field(default=12, ge=1)
    # A restart storm: a job restarted restart_storm_restarts times within restart_storm_seconds, or
    # max_migrations_per_hour times in the hour, or restart_storm_without_progress times in a row from the
    # same checkpoint step, opens one critical incident; automatic restarts of the job stop until a person
    # resolves it (remediation/storms.py).
    restart_storm_restarts: int = Field(default=5, ge=1)
    restart_storm_seconds: float = Field(default=1800.0, gt=0)
    restart_storm_without_progress: int = Field(default=3, ge=1)
    probe_threshold: float = Field(default=0.8, gt=0, le=1)  # a suspect below this share of its rate is quarantined
    probe_timeout_seconds: float = Field(default=30.0, gt=0)
    order_ack_seconds: float = Field(default=30.0, gt=0)
    order_webhook_secret: str = Field(default="", repr=False)
    breaker_share: float = Field(default=0.10, gt=0, le=1)
    breaker_min_accelerators: int = Field(default=8, ge=0)
    breaker_window_seconds: float = Field(default=3600.0, gt=0)
    breaker_domain_label: str = "rack"
    breaker_domain_share: float = Field(default=0.5, gt=0, le=1)
    # Network tier (sentinel/network/, docs/network.md). Probe mesh: each agent that advertises a probe address
    # (`sentinel collector --probe HOST:PORT`) probes probe_peers others, a subset that rotates every
    # probe_round_seconds; pairs are judged over probe_window_seconds. A pair is bad at probe_loss_ratio loss or a
    # median RTT above both probe_rtt_seconds and probe_rtt_factor × the fleet's median (UDP round trips between
    # agents on the management network, not RDMA verbs: a RoCE-level 10 µs alarm needs ib_send_lat, which this
    # does not run). A node is unreachable once probe_unreachable_probers peers lost everything sent to it.
    probe_peers: int = Field(default=8, ge=0, le=64)
    probe_round_seconds: float = Field(default=10.0, ge=1, le=3600)
    probe_window_seconds: float = Field(default=60.0, ge=5, le=3600)
    probe_rtt_seconds: float = Field(default=0.005, gt=0, le=10)  # a loaded host's responder adds ~2 ms
    probe_rtt_factor: float = Field(default=4.0, ge=1, le=1000)
    probe_loss_ratio: float = Field(default=0.2, gt=0, le=1)
    probe_unreachable_probers: int = Field(default=2, ge=1, le=64)
    network_domain_labels: list[str] = ["rack", "switch"]  # node labels that name a failure domain
    nic_rules_file: Path | None = None  # RDMA port rules (sentinel/network/nic_rules.toml); a file replaces them
    # Nodes at an end of a slow link, or bad on every probed pair, take no new work while that holds.
    network_exclude_slow_nodes: bool = False
    # Alerting: receivers (alertmanager | webhook | slack | pagerduty), each with its own route filter.
    receivers: list[ReceiverConfig] = []
    alert_resend_seconds: float = Field(default=60.0, gt=0)
    notify_max_attempts: int = Field(default=12, ge=1)
    log_level: str = "INFO"
    # High availability (PostgreSQL only): servers sharing a database elect one leader with an advisory
    # lock named by `ha_lock_name`; the others stand by, serve reads, and try the lock every check.
    leader_check_seconds: float = Field(default=1.0, gt=0, le=60)
    ha_lock_name: str = "sentinel"
    server_name: str = ""  # in logs and pg_stat_activity; default host:port
    # Cells (docs/cells.md): this server's cell, added as a `cell` label to every alert it sends (Alertmanager,
    # webhook, PagerDuty, Slack), so that one Alertmanager cluster tells cells apart even where node names repeat.
    cell: str = Field(default="", max_length=63, pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]*)?$")

    @field_validator("workers")
    @classmethod
    def _workers(cls, value: int | str) -> int | str:
        if value != "auto" and not (isinstance(value, int) and 0 <= value <= 64):
            raise ValueError("workers is a number of edge worker processes (0 to 64) or 'auto'")
        return value

    @property
    def worker_count(self) -> int:
        if self.workers == "auto":  # one per core the process may run on, less the core's own
            try:
                cores = len(os.sched_getaffinity(0))
            except AttributeError:  # not Linux
                cores = os.cpu_count() or 1
            return max(1, cores - 1)
        return int(self.workers)

    @field_validator("database_url")
    @classmethod
    def _known_driver(cls, value: str) -> str:
        if value and not value.startswith(("sqlite", "postgresql")):
            raise ValueError("SENTINEL_DATABASE_URL must be sqlite:///… or postgresql+psycopg://…")
        return value

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'sentinel.db'}"

    @property
    def admin_token_file(self) -> Path:
        return self.data_dir / "admin-token"


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Environment wins over the TOML file (`SENTINEL_CONFIG` or the argument); overrides win over both."""
    path = config_file or os.environ.get("SENTINEL_CONFIG")
    from_file: dict[str, Any] = {}
    if path:
        with open(path, "rb") as fh:
            from_file = tomllib.load(fh).get("sentinel", {})
    env_keys = {name for name in Settings.model_fields if f"SENTINEL_{name.upper()}" in os.environ}
    merged = {k: v for k, v in from_file.items() if k not in env_keys}
    merged.update({k: v for k, v in overrides.items() if v is not None})
    return Settings(**merged)

"""Settings: parse (environment `SENTINEL_*`, optional TOML file) → defaults → validate."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    """A per-user data directory, following XDG where it is set."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "sentinel"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SENTINEL_", extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str = ""
    host: str = "127.0.0.1"
    port: int = Field(default=9480, ge=0, le=65535)
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    # Liveness: a node is down after this many of its own intervals without a report.
    missed_intervals_down: int = Field(default=3, ge=1)
    liveness_check_seconds: float = Field(default=1.0, gt=0)
    liveness_flush_seconds: float = Field(default=5.0, gt=0)
    # Receipts make ingest idempotent on (node, seq); older ones are pruned.
    receipt_retention_seconds: float = Field(default=24 * 3600.0, gt=0)
    window_samples: int = Field(default=60, ge=1, le=10_000)
    metrics_require_token: bool = True
    log_level: str = "INFO"

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

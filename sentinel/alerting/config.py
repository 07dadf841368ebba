"""Receivers and their routes, from the `[[sentinel.receivers]]` tables of the config file
(or `SENTINEL_RECEIVERS` as JSON). Routing is a filter per receiver: severity and label matchers."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

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

"""Tokens: created with a role, stored as SHA-256, looked up by hash (with a short cache)."""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from sentinel.auth.models import ROLES, ApiToken
from sentinel.db import utcnow

TOKEN_PREFIX = "snt_"


@dataclass(frozen=True)
class Principal:
    token_id: int
    name: str
    role: str

    @property
    def actor(self) -> str:
        return f"{self.role}:{self.name}"


def hash_token(secret: str) -> str:
    # Tokens carry 256 random bits, so a fast hash is enough; a slow KDF would only slow ingest.
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(session: Session, *, name: str, role: str, expires_at: datetime | None = None) -> str:
    """Store a new token and return its secret, which is not kept anywhere."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiToken(name=name, role=role, prefix=secret[:12], token_hash=hash_token(secret),
                         expires_at=expires_at))
    session.flush()
    return secret


def count_tokens(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(ApiToken)) or 0


def find_principal(session: Session, secret: str) -> Principal | None:
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(secret)))
    if row is None or row.revoked_at is not None:
        return None
    if row.expires_at is not None and row.expires_at <= utcnow():
        return None
    return Principal(token_id=row.id, name=row.name, role=row.role)


class TokenCache:
    """Avoids a database read per request; a revoked token stops working within `ttl_seconds`."""

    def __init__(self, factory: sessionmaker[Session], ttl_seconds: float = 5.0, max_entries: int = 100_000):
        self._factory = factory
        self._ttl = ttl_seconds
        self._max = max_entries
        self._entries: dict[str, tuple[float, Principal | None]] = {}
        self._lock = threading.Lock()

    def lookup(self, secret: str) -> Principal | None:
        now = time.monotonic()
        with self._lock:
            hit = self._entries.get(secret)
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        return self.refresh(secret)

    def refresh(self, secret: str) -> Principal | None:
        """Read the token from the database (whatever the cache holds) and cache the answer."""
        now = time.monotonic()
        with self._factory() as session:
            principal = find_principal(session, secret)
        with self._lock:
            if len(self._entries) >= self._max:
                self._entries.clear()
            self._entries[secret] = (now, principal)
        return principal

    def is_fresh(self, secret: str, margin: float = 1.0) -> bool:
        """Whether `lookup(secret)` will be answered from memory for at least `margin` more seconds.
        Lets an async caller refresh in a worker thread first and then look up on its event loop."""
        with self._lock:
            hit = self._entries.get(secret)
        return hit is not None and time.monotonic() - hit[0] < self._ttl - margin

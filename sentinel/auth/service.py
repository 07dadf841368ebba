"""Tokens: created with a role, stored as SHA-256, looked up by hash (with a short cache), revoked by id."""

from __future__ import annotations

import fnmatch
import hashlib
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from sentinel.auth.models import ROLES, ApiToken
from sentinel.auth.ratelimit import RateLimiter
from sentinel.db import utcnow

TOKEN_PREFIX = "snt_"


@dataclass(frozen=True)
class Principal:
    token_id: int
    name: str
    role: str
    node: str | None = None  # the binding of an agent token: a node name or a glob
    rate_limit_per_second: float | None = None

    @property
    def actor(self) -> str:
        return f"{self.role}:{self.name}"

    def may_act_for(self, node: str) -> bool:
        """Admins act for any node; an agent only for nodes matching its binding (none yet: none)."""
        if self.role == "admin":
            return True
        if self.node is None:
            return False
        return node == self.node or fnmatch.fnmatchcase(node, self.node)


class TokenNotFound(LookupError):
    pass


def hash_token(secret: str) -> str:
    # Tokens carry 256 random bits, so a fast hash is enough; a slow KDF would only slow ingest.
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(session: Session, *, name: str, role: str, expires_at: datetime | None = None,
                 node: str | None = None, rate_limit_per_second: float | None = None) -> str:
    """Store a new token and return its secret, which is not kept anywhere."""
    return issue_token(session, name=name, role=role, expires_at=expires_at, node=node,
                       rate_limit_per_second=rate_limit_per_second)[1]


def issue_token(session: Session, *, name: str, role: str, expires_at: datetime | None = None,
                node: str | None = None, rate_limit_per_second: float | None = None) -> tuple[ApiToken, str]:
    """`create_token`, also answering the stored row (its id)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
    if node is not None and role not in ("agent", "admin"):
        raise ValueError(f"a node binding is for agent tokens; {role!r} tokens do not act for nodes")
    if rate_limit_per_second is not None and rate_limit_per_second < 0:
        raise ValueError("rate_limit_per_second must be 0 (unlimited) or more")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(name=name, role=role, prefix=secret[:12], token_hash=hash_token(secret), expires_at=expires_at,
                   node=node, rate_limit_per_second=rate_limit_per_second)
    session.add(row)
    session.flush()
    return row, secret


def count_tokens(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(ApiToken)) or 0


def list_tokens(session: Session, *, include_revoked: bool = True) -> list[ApiToken]:
    query = select(ApiToken).order_by(ApiToken.id)
    if not include_revoked:
        query = query.where(ApiToken.revoked_at.is_(None))
    return list(session.scalars(query))


def find_token(session: Session, *, id_or_name: str | int) -> ApiToken:
    """By id, or by name when exactly one live token has it (names are not unique)."""
    if isinstance(id_or_name, int) or str(id_or_name).isdigit():
        row = session.get(ApiToken, int(id_or_name))
        if row is None:
            raise TokenNotFound(f"no token with id {id_or_name}")
        return row
    rows = list(session.scalars(select(ApiToken).where(ApiToken.name == id_or_name).order_by(ApiToken.id)))
    live = [r for r in rows if r.revoked_at is None] or rows
    if not live:
        raise TokenNotFound(f"no token named {id_or_name!r}")
    if len(live) > 1:
        raise TokenNotFound(f"{len(live)} tokens are named {id_or_name!r} (ids "
                            f"{', '.join(str(r.id) for r in live)}); give the id")
    return live[0]


def revoke_token(session: Session, *, token: ApiToken) -> bool:
    """Mark revoked; False when it already was (revoking is idempotent and keeps the first time)."""
    if token.revoked_at is not None:
        return False
    token.revoked_at = utcnow()
    session.flush()
    return True


def bind_token_to_node(session: Session, *, token_id: int, node: str) -> str | None:
    """Trust on first use: bind an unbound token to `node`. Returns the binding the token has afterwards
    (`node`, or whatever another request or server bound it to first); the update is conditional, so two
    racing first registrations cannot both win."""
    session.execute(update(ApiToken).where(ApiToken.id == token_id, ApiToken.node.is_(None)).values(node=node))
    return session.scalar(select(ApiToken.node).where(ApiToken.id == token_id))


def find_principal(session: Session, secret: str) -> Principal | None:
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(secret)))
    if row is None or row.revoked_at is not None:
        return None
    if row.expires_at is not None and row.expires_at <= utcnow():
        return None
    return Principal(token_id=row.id, name=row.name, role=row.role, node=row.node,
                     rate_limit_per_second=row.rate_limit_per_second)


class TokenCache:
    """Avoids a database read per request. A token revoked or rebound here is dropped at once
    (`forget`); one revoked through another server stops working within `ttl_seconds`."""

    def __init__(self, factory: sessionmaker[Session], ttl_seconds: float = 5.0, max_entries: int = 100_000):
        self._factory = factory
        self._ttl = ttl_seconds
        self._max = max_entries
        self._entries: dict[str, tuple[float, Principal | None]] = {}
        self._by_token: dict[int, set[str]] = {}  # token id → cached secrets, to forget a revoked token
        self._lock = threading.Lock()
        self.limiter = RateLimiter()

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
                self._by_token.clear()
            self._entries[secret] = (now, principal)
            if principal is not None:
                self._by_token.setdefault(principal.token_id, set()).add(secret)
        return principal

    def forget(self, token_id: int) -> None:
        """Drop what is cached for a token, so the next request reads the database (revoked, rebound)."""
        with self._lock:
            for secret in self._by_token.pop(token_id, set()):
                self._entries.pop(secret, None)

    def is_fresh(self, secret: str, margin: float = 1.0) -> bool:
        """Whether `lookup(secret)` will be answered from memory for at least `margin` more seconds.
        Lets an async caller refresh in a worker thread first and then look up on its event loop."""
        with self._lock:
            hit = self._entries.get(secret)
        return hit is not None and time.monotonic() - hit[0] < self._ttl - margin

"""Role checks for routers: `Depends(allow(OPERATE))` on every endpoint but health checks.

`authenticate` also enforces the token's request rate (auth/ratelimit.py) and notes who called for the audit
middleware (audit/middleware.py); `check_node` enforces an agent token's node binding.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException, Request, status

from sentinel.audit.context import note_principal
from sentinel.auth.ratelimit import RateLimited
from sentinel.auth.service import Principal, TokenCache

READ = frozenset({"viewer", "operator", "launcher", "admin"})
AGENT = frozenset({"agent", "admin"})
LAUNCH = frozenset({"launcher", "operator", "admin"})
OPERATE = frozenset({"operator", "admin"})
ADMIN = frozenset({"admin"})

log = logging.getLogger("sentinel.auth")


def bearer_secret(request: Request) -> str | None:
    return bearer_value(request.headers.get("authorization", ""))


def bearer_value(header: str) -> str | None:
    """The secret of an `Authorization: Bearer <secret>` header's value, or None."""
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return None
    return secret.strip()


def authenticate(request: Request) -> Principal:
    return authenticate_secret(request.app.state.runtime, bearer_secret(request), request.url.path)


def authenticate_secret(runtime: Any, secret: str | None, path: str) -> Principal:
    """`authenticate` without a Request (the report path is pure ASGI: nodes/api.py)."""
    if secret is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing bearer token (Authorization: Bearer …)",
                            headers={"WWW-Authenticate": "Bearer"})
    cache: TokenCache = runtime.tokens
    principal = cache.lookup(secret)
    if principal is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "unknown, revoked or expired token",
                            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
    _limit_rate(runtime, principal, path)
    note_principal(principal.actor)
    return principal


def limit_rate(request: Request, principal: Principal) -> None:
    """429 once the token spent its burst faster than its rate (the token's own, else the server's)."""
    _limit_rate(request.app.state.runtime, principal, request.url.path)


def _limit_rate(runtime: Any, principal: Principal, path: str) -> None:
    settings = runtime.settings
    rate = settings.rate_limit_per_second if principal.rate_limit_per_second is None \
        else principal.rate_limit_per_second
    try:
        runtime.tokens.limiter.take(principal.token_id, role=principal.role, now=runtime.clock.time(), rate=rate,
                                    burst=settings.rate_limit_burst)
    except RateLimited as exc:
        retry = max(1, math.ceil(exc.retry_after_seconds))
        log.debug("rate limited: token=%d name=%s rate=%g/s path=%s", principal.token_id, principal.name, rate,
                  path)
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS,
                            f"token {principal.name!r} (id {principal.token_id}) is over its limit of {rate:g} "
                            f"requests/s; retry after {retry}s", headers={"Retry-After": str(retry)}) from None


def allow(roles: frozenset[str]) -> Callable[[Request], Principal]:
    def check(request: Request) -> Principal:
        principal = authenticate(request)
        check_role(principal, roles, request.method, request.url.path)
        return principal

    return check


def check_role(principal: Principal, roles: frozenset[str], method: str, path: str) -> None:
    """403 unless the principal's role is one of `roles`."""
    if principal.role not in roles:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"role {principal.role!r} may not {method} {path}; "
                                                       f"needs one of: {', '.join(sorted(roles))}")


def check_node(principal: Principal, node: str) -> None:
    """403 unless the token may act for `node` (Principal.may_act_for). An unbound agent token acts for no
    node until its first registration binds it (nodes/api.py)."""
    if principal.may_act_for(node):
        return
    who = f"token {principal.name!r} (id {principal.token_id})"
    if principal.node is None:
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"{who} is not bound to a node yet and may not act for node {node!r}; "
                            "its first POST /api/v1/nodes/register binds it")
    raise HTTPException(status.HTTP_403_FORBIDDEN,
                        f"{who} is bound to node {principal.node!r} and may not act for node {node!r}")

"""Role checks for routers: `Depends(allow(OPERATE))` on every endpoint but health checks."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import HTTPException, Request, status

from sentinel.auth.service import Principal, TokenCache

READ = frozenset({"viewer", "operator", "launcher", "admin"})
AGENT = frozenset({"agent", "admin"})
LAUNCH = frozenset({"launcher", "operator", "admin"})
OPERATE = frozenset({"operator", "admin"})
ADMIN = frozenset({"admin"})


def bearer_secret(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return None
    return secret.strip()


def authenticate(request: Request) -> Principal:
    secret = bearer_secret(request)
    if secret is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing bearer token (Authorization: Bearer …)",
                            headers={"WWW-Authenticate": "Bearer"})
    cache: TokenCache = request.app.state.runtime.tokens
    principal = cache.lookup(secret)
    if principal is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "unknown, revoked or expired token",
                            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
    return principal


def allow(roles: frozenset[str]) -> Callable[[Request], Principal]:
    needed = ", ".join(sorted(roles))

    def check(request: Request) -> Principal:
        principal = authenticate(request)
        if principal.role not in roles:
            raise HTTPException(status.HTTP_403_FORBIDDEN,
                                f"role {principal.role!r} may not {request.method} {request.url.path}; "
                                f"needs one of: {needed}")
        return principal

    return check

"""The server's own read-only status page, for people without Grafana.

Browsers cannot send a bearer header, so `POST /ui/login` checks a token like `auth/deps.py` does and
keeps it in an HttpOnly, SameSite=Strict cookie scoped to `/ui`; `GET /ui` also takes a bearer header
(curl). Tokens are never accepted in the URL: URLs end up in logs and browser history.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from sentinel.auth.deps import READ, bearer_secret
from sentinel.auth.service import Principal, TokenCache
from sentinel.deps import Live, Remediation, ServerClock, Sessions, Tokens
from sentinel.ui.render import login_page, status_page
from sentinel.ui.status import gather

log = logging.getLogger("sentinel.ui")
router = APIRouter()

COOKIE = "sentinel_session"
SESSION_SECONDS = 12 * 3600
MAX_TOKEN_CHARS = 512
# No script at all: the page refreshes with <meta http-equiv="refresh">, so an escaping slip cannot run code.
HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                                "frame-ancestors 'none'; base-uri 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=HEADERS)


def _lookup(tokens: TokenCache, secret: str) -> Principal | None:
    """The principal behind a token, as `auth/deps.py` finds it; anything far longer than a token is unknown."""
    return tokens.lookup(secret) if len(secret) <= MAX_TOKEN_CHARS else None


def _refuse(principal: Principal | None) -> tuple[int, str] | None:
    """(status, message) when `principal` may not read; None when it may."""
    if principal is None:
        return 401, "That token is unknown, revoked or expired."
    if principal.role not in READ:
        return 403, (f"Role {principal.role!r} may not read the status page; "
                     "use a viewer, operator, launcher or admin token.")
    return None


@router.get("/ui", response_class=HTMLResponse, include_in_schema=False)
def get_status_page(request: Request, sessions: Sessions, live: Live, remediation: Remediation, clock: ServerClock,
                    tokens: Tokens) -> Response:
    """The fleet grid, open incidents, job signals and the breaker; a login form without a valid session."""
    base = _base(request)
    from_header = bearer_secret(request)
    secret = from_header or request.cookies.get(COOKIE)
    if not secret:
        return _html(login_page(base))
    principal = _lookup(tokens, secret)
    refused = _refuse(principal)
    if refused is not None:
        status, message = refused
        response = _html(login_page(base, message if from_header else f"Your session ended. {message}"), status)
        if not from_header:
            response.delete_cookie(COOKIE, path=f"{base}/ui")
        return response
    assert principal is not None
    return _html(status_page(gather(sessions, live, remediation, clock, principal), base))


@router.post("/ui/login", response_class=HTMLResponse, include_in_schema=False)
async def login(request: Request, tokens: Tokens) -> Response:
    """Check the form's token and keep it in a cookie; the browser then follows the redirect to /ui."""
    base = _base(request)
    form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=8)
    token = (form.get("token") or [""])[0].strip()
    if not token:
        return _html(login_page(base, "Paste a token to sign in."), 400)
    principal = await run_in_threadpool(_lookup, tokens, token)
    refused = _refuse(principal)
    client = request.client.host if request.client else "-"
    if refused is not None:
        log.warning("status page sign-in refused: status=%d client=%s", refused[0], client)
        return _html(login_page(base, refused[1]), refused[0])
    assert principal is not None
    log.info("status page sign-in: actor=%s client=%s", principal.actor, client)
    response = RedirectResponse(f"{base}/ui", status_code=303, headers=HEADERS)
    # the token is one that matched a stored token, so it is made of cookie-safe characters only
    response.set_cookie(COOKIE, token, max_age=SESSION_SECONDS, path=f"{base}/ui", httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
    return response


@router.post("/ui/logout", include_in_schema=False)
def logout(request: Request) -> Response:
    base = _base(request)
    response = RedirectResponse(f"{base}/ui", status_code=303, headers=HEADERS)
    response.delete_cookie(COOKIE, path=f"{base}/ui", httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")
    return response

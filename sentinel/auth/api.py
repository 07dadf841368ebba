"""Tokens: create, list, revoke (admin). Also carries the audit log's routes, so the app includes one router."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException

from sentinel.audit.service import record
from sentinel.auth.deps import ADMIN, allow
from sentinel.auth.schemas import TokenCreate, TokenCreated, TokenOut
from sentinel.auth.service import Principal, TokenNotFound, find_token, issue_token, list_tokens, revoke_token
from sentinel.db import transaction
from sentinel.deps import Sessions, Tokens, not_found

log = logging.getLogger("sentinel.auth")
router = APIRouter()

Admin = Annotated[Principal, Depends(allow(ADMIN))]


@router.post("/tokens", response_model=TokenCreated, status_code=201, tags=["auth"])
def post_token(spec: TokenCreate, sessions: Sessions, who: Admin) -> TokenCreated:
    with transaction(sessions) as session:
        try:
            token, secret = issue_token(session, name=spec.name, role=spec.role, expires_at=spec.expires_at,
                                        node=spec.node, rate_limit_per_second=spec.rate_limit_per_second)
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from exc
        token_id = token.id
        record(session, actor=who.actor, action="token.create", subject=f"token/{spec.name}",
               detail={"id": token_id, "role": spec.role, "node": spec.node,
                       "rate_limit_per_second": spec.rate_limit_per_second})
    log.info("token created: id=%d name=%s role=%s node=%s by=%s", token_id, spec.name, spec.role, spec.node,
             who.actor)
    return TokenCreated(id=token_id, name=spec.name, role=spec.role, node=spec.node, token=secret)


@router.get("/tokens", response_model=list[TokenOut], tags=["auth"])
def get_tokens(sessions: Sessions, _: Admin, revoked: bool = True) -> list[TokenOut]:
    """Every token without its secret or hash; `revoked=false` leaves out revoked ones."""
    with sessions() as session:
        return [TokenOut.model_validate(row) for row in list_tokens(session, include_revoked=revoked)]


@router.post("/tokens/{token_id}/revoke", response_model=TokenOut, tags=["auth"])
def post_revoke(token_id: int, sessions: Sessions, tokens: Tokens, who: Admin) -> TokenOut:
    """Stops the token at once on this server, within the token cache's 5 s on others. Idempotent."""
    with transaction(sessions) as session:
        try:
            token = find_token(session, id_or_name=token_id)
        except TokenNotFound as exc:
            raise not_found(exc) from exc
        changed = revoke_token(session, token=token)
        if changed:
            record(session, actor=who.actor, action="token.revoke", subject=f"token/{token.name}",
                   detail={"id": token.id, "role": token.role})
        out = TokenOut.model_validate(token)
    tokens.forget(token_id)
    if changed:
        log.info("token revoked: id=%d name=%s by=%s", token_id, out.name, who.actor)
    return out

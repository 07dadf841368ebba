from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from sentinel.audit.service import record
from sentinel.auth.deps import ADMIN, allow
from sentinel.auth.schemas import TokenCreate, TokenCreated
from sentinel.auth.service import Principal, create_token
from sentinel.db import transaction
from sentinel.deps import runtime
from sentinel.runtime import Runtime

router = APIRouter(prefix="/tokens", tags=["auth"])


@router.post("", response_model=TokenCreated, status_code=201)
def post_token(spec: TokenCreate, rt: Annotated[Runtime, Depends(runtime)],
               who: Annotated[Principal, Depends(allow(ADMIN))]) -> TokenCreated:
    with transaction(rt.factory) as session:
        secret = create_token(session, name=spec.name, role=spec.role, expires_at=spec.expires_at)
        record(session, actor=who.actor, action="token.create", subject=f"token/{spec.name}",
               detail={"role": spec.role})
    return TokenCreated(name=spec.name, role=spec.role, token=secret)

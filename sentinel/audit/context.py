"""What the audit middleware learns during one request: who called, and whether the handler audited it.

The middleware puts a fresh `CallNote` in a context variable; `authenticate` and `record` fill it in. The
note is a mutable object, so sync handlers (run in a worker thread with a copy of the context) reach it too.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass


@dataclass
class CallNote:
    actor: str | None = None
    audited: bool = False


current_call: ContextVar[CallNote | None] = ContextVar("sentinel_audit_call", default=None)


def note_principal(actor: str) -> None:
    note = current_call.get()
    if note is not None:
        note.actor = actor


def note_audited() -> None:
    note = current_call.get()
    if note is not None:
        note.audited = True

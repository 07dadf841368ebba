"""What a training or serving process imports: timing, MFU maths, and (later) checkpoints.

`import sentinel.sdk` pulls in the standard library only — never the server, FastAPI or SQLAlchemy.
"""

from __future__ import annotations

import threading

from sentinel.sdk.telemetry import Telemetry

_default: Telemetry | None = None
_default_lock = threading.Lock()


def init(**kwargs: object) -> Telemetry:
    """The process-wide recorder, configured from `SENTINEL_*` variables; arguments override them."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Telemetry(**kwargs)  # type: ignore[arg-type]
            _default.install_excepthook()
        return _default


__all__ = ["Telemetry", "init"]

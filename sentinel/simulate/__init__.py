"""`sentinel simulate`: a synthetic fleet driven against a running server from one cheap process.

Every node registers with the real `NodeRegistration` and sends real `NodeReport`s (growing `seq`, 8
accelerator samples, host metrics) on `POST /api/v1/nodes/{node}/reports`, its phase spread evenly over
the interval. Bodies are assembled from pre-rendered JSON fragments (one per utilization level, as
`collectors/sim.py` derives power and temperature from utilization), so a report costs a few string joins,
and a node's state is its `seq`. The HTTP client is a minimal HTTP/1.1 keep-alive client on asyncio streams:
one connection per sender, `--connections` in all. A report that fails is retried in seq order, like the
agent's spool, and counted; one the server refuses for good is lost, and the exit status says so.
"""

from sentinel.simulate.fleet import Fleet, registration
from sentinel.simulate.runner import Options, Simulator

__all__ = ["Fleet", "Options", "Simulator", "registration"]

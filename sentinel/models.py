"""Every domain's tables, imported in one place for Alembic's metadata."""

from sentinel.accelerators.models import Accelerator
from sentinel.alerting.models import DeliveryAttempt, Notification, Silence
from sentinel.audit.models import AuditEntry
from sentinel.auth.models import ApiToken
from sentinel.checkpoints.models import Checkpoint, CheckpointShard
from sentinel.db import Base
from sentinel.events.models import Event
from sentinel.incidents.models import Incident
from sentinel.jobs.models import Job, Task
from sentinel.nodes.models import Node
from sentinel.policy.models import PolicyDecision
from sentinel.remediation.models import BreakerState, Order, Remediation
from sentinel.telemetry.models import ReportReceipt

__all__ = [
           "Accelerator",
           "ApiToken",
           "AuditEntry",
           "Base",
           "BreakerState",
           "Checkpoint",
           "CheckpointShard",
           "DeliveryAttempt",
           "Event",
           "Incident",
           "Job",
           "Node",
           "Notification",
           "Order",
           "PolicyDecision",
           "Remediation",
           "ReportReceipt",
           "Silence",
           "Task",
]

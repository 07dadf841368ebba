"""Sentinel: cluster observability and fault tolerance for accelerator clusters."""

__version__ = "0.1.0"

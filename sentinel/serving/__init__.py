"""Serving jobs: request signals, SLO attainment, serving detectors, the batching controller, replica failover.

`buckets` is imported by the SDK and the agent, so it uses the standard library alone."""

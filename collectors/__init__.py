"""The per-node agent: one module per source, the push pipeline with its spool, and /metrics."""

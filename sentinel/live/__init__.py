"""The live layer: what the leading server holds in memory between database writes (view.py names its parts),
rebuilt from SQL when a server takes the lead. SQL stays the record; these are views of it, kept current by
the report pipeline (pipeline/report.py) and read by detectors, remediation, the API and /metrics."""

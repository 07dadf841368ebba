"""Grafana: push Sentinel's dashboards into a Grafana folder, idempotently (`sentinel.grafana.push.push`).

Nothing is re-exported here: a package attribute named `push` would shadow the `push` module.
"""

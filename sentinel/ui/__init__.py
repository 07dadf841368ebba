"""The server's own read-only status page (GET /ui) for people without Grafana."""

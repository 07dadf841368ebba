"""The MCP server for agents: tools over the same REST API, roles, audit and breaker (server.py)."""

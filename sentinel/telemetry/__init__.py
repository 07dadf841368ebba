"""Node reports: the wire schema shared by the agent and the server, and their ingest."""

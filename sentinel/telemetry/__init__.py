"""Node reports: the wire schema the agent and the server share (schemas.py) and their receipts (models.py).
Accepting a report is the pipeline's (sentinel/pipeline/)."""

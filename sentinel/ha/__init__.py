"""High availability: who leads (`leader.py`, a database lock) and how clients find the leader (`failover.py`)."""

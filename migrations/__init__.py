"""Alembic environment and versions: the schema is only ever built by these."""

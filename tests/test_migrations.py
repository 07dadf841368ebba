"""The schema is built by Alembic only, and the models agree with the migrations."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from sentinel.db import upgrade
from sentinel.models import Base


def test_upgrade_builds_every_table_and_matches_the_models(database_url):
    upgrade(database_url)
    upgrade(database_url)  # a second run is a no-op
    engine = create_engine(database_url)
    with engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert set(Base.metadata.tables) <= tables
    assert "alembic_version" in tables
    assert diff == [], f"models and migrations disagree: {diff}"

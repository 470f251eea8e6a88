"""A store written before revisions were kept (anatomy 0.x up to this release's first): the tables
and the columns added since the first schema, where it lacks them.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import Column, inspect

from anatomy.store import tables

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Columns added after the first release of the schema: a file written before holds its tables
# without them.
ADDED_COLUMNS = (("sweeps", "pid"), ("runs", "source"), ("runs", "origin"), ("runs", "recorder"),
                 ("phases", "rank"), ("steps", "rank"), ("steps", "seq_len"))


def upgrade() -> None:
    bind = op.get_bind()
    # Tables a store written before them lacks (the device panel's, the buckets, store_info) are
    # made as this revision declares them (today's declaration; a later revision changing one
    # of them does so with its own operations).
    tables.metadata.create_all(bind, checkfirst=True)
    found = inspect(bind)
    for table, column in ADDED_COLUMNS:
        if column not in {c["name"] for c in found.get_columns(table)}:
            declared = tables.metadata.tables[table].c[column]
            op.add_column(table, Column(column, declared.type, nullable=declared.nullable,
                                        server_default=declared.server_default))


def downgrade() -> None:
    raise NotImplementedError("a store is never downgraded: an older anatomy refuses it")

"""The device panel per host: each host of a run across hosts stores its own readings, its host
rows under its place among the run's hosts (its GPUs' under device_key(host, i), as its samples).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import Column, inspect

from anatomy.store import tables

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # 0001 makes the tables a store lacks from today's declaration: the column may be there.
    if "host" not in {c["name"] for c in inspect(op.get_bind()).get_columns("host_status")}:
        declared = tables.host_status.c.host
        op.add_column("host_status", Column("host", declared.type, nullable=False,
                                            server_default=declared.server_default.arg))


def downgrade() -> None:
    raise NotImplementedError("a store is never downgraded: an older anatomy refuses it")

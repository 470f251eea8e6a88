"""Runs across hosts: each run's launch key and host count, the one running run of a key, and a
row per host of such a run (its name, its beat, how it ended).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import Column, inspect

from anatomy.store import tables

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    found = inspect(bind)
    have = {c["name"] for c in found.get_columns("runs")}
    for name in ("run_key", "host_count"):
        if name not in have:
            declared = tables.runs.c[name]
            op.add_column("runs", Column(name, declared.type, nullable=True))
    # 0001 makes the tables a store lacks from today's declaration: run_hosts may be there.
    tables.run_hosts.create(bind, checkfirst=True)
    index = next(i for i in tables.runs.indexes if i.name == "runs_running_key")
    if index.name not in {i["name"] for i in inspect(bind).get_indexes("runs")}:
        index.create(bind)


def downgrade() -> None:
    raise NotImplementedError("a store is never downgraded: an older anatomy refuses it")

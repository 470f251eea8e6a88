"""Coarser min/max buckets beside the 0.1 s ones (tables.coarse_buckets), filled for the runs the
store holds from their 0.1 s buckets: a long run's chart and peaks read them from now on; the
steps indexed by rank and time.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import inspect

from anatomy.store import tables
from anatomy.store.database import Db, _merge_coarse

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

CHUNK = 100_000  # 0.1 s buckets folded at a time: a run of hours holds millions


def upgrade() -> None:
    bind = op.get_bind()
    # 0001 makes the tables a store lacks from today's declaration: it may be there already.
    tables.coarse_buckets.create(bind, checkfirst=True)
    index = next(i for i in tables.steps.indexes if i.name == "steps_rank")
    if index.name not in {i["name"] for i in inspect(bind).get_indexes("steps")}:
        index.create(bind)
    db = Db(bind)
    runs = [r[0] for r in db.execute("SELECT DISTINCT run_id FROM sample_buckets")]
    for run_id in runs:
        cursor = db.execute("SELECT gpu, bucket, t_min, used_min, t_max, used_max, reserved, total"
                            " FROM sample_buckets WHERE run_id = ?", (run_id,))
        while rows := cursor.fetchmany(CHUNK):
            _merge_coarse(db, run_id, {(r[0], r[1]): r[2:] for r in rows})


def downgrade() -> None:
    raise NotImplementedError("a store is never downgraded: an older anatomy refuses it")

"""How a database is known to be anatomy's, and its schema brought to this release's: a new store
made from the tables' declaration (store/tables.py), an older one upgraded in place by alembic's
migrations (store/migrations/), a newer one refused."""

from __future__ import annotations

import uuid
from pathlib import Path

from sqlalchemy import Connection, inspect, select, text
from sqlalchemy.exc import DBAPIError

from anatomy.store import tables
from anatomy.store.errors import StoreError, why
from anatomy.store.location import ServerUrl

# Columns that make a table anatomy's: a file whose tables of these names lack them is another
# program's (MLflow's store has a "runs" table too).
SIGNATURES = {
    "runs": {"id", "status", "preset", "options", "backend"},
    "samples": {"run_id", "t", "gpu", "used"},
    "sweeps": {"key", "base", "vary", "planned"},
}

MIGRATIONS = Path(__file__).with_name("migrations")
# The newest revision in store/migrations/versions/: a store at it needs no migration (and no
# alembic loaded). tests/unit/test_store_engines.py holds it to the scripts' head.
HEAD = "0004"
VERSION_TABLE = "alembic_version"
# PostgreSQL's lock for a schema being made or migrated: two processes opening a new store at
# once (a Pool's trials) must not both create its tables.
SCHEMA_LOCK = 0x616E61746F6D79  # "anatomy"
INSUFFICIENT_PRIVILEGE = "42501"  # PostgreSQL's SQLSTATE for a right the role lacks


def check(db: Connection, where: Path | ServerUrl) -> list[str]:
    """Refuse another program's database: anatomy's has no tables yet, or ours by name and
    columns. Its tables."""
    found = inspect(db)
    if db.dialect.name == "sqlite":  # in the order they were made, as a user's tool lists them
        names = [r[0] for r in db.exec_driver_sql("SELECT name FROM sqlite_master WHERE type ="
                                                  " 'table' AND name NOT LIKE 'sqlite_%'")]
    else:
        names = found.get_table_names()
    ours = [t for t in names if t in SIGNATURES]
    foreign = [t for t in ours if not SIGNATURES[t] <= {c["name"] for c in found.get_columns(t)}]
    if (names and not ours) or foreign:
        shown = ", ".join(names[:5]) + (", …" if len(names) > 5 else "")
        raise StoreError(where, f"it is not an anatomy store: it holds another program's"
                         f" tables ({shown})")
    return names


def revision(db: Connection, names: list[str]) -> str | None:
    """The schema revision the store is at; None for a store written before revisions were
    kept (or a new one)."""
    if VERSION_TABLE not in names:
        return None
    return db.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def refuse_newer(where: Path | ServerUrl, current: str | None) -> None:
    """A store at a revision this release's migrations do not know was written by a newer one:
    refused in one line, nothing written."""
    if current is None or current == HEAD:
        return
    from alembic.util.exc import CommandError
    try:
        known = _scripts().get_revision(current) is not None
    except CommandError:
        known = False
    if not known:
        raise StoreError(where, f"it was written by a newer anatomy (schema revision {current};"
                                f" this one knows up to {HEAD}): upgrade anatomy to use it")


def _config():
    from alembic.config import Config
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def _scripts():
    from alembic.script import ScriptDirectory
    return ScriptDirectory.from_config(_config())


def migrate(db: Connection, where: Path | ServerUrl) -> None:
    """The store at this release's schema, inside the caller's write transaction (SQLite's
    immediate one, PostgreSQL's under SCHEMA_LOCK): made where new, upgraded where older, refused
    where newer; the store's id given once."""
    if db.dialect.name == "postgresql":
        if _at_head(db):  # the common open of a server's store: one query, not its catalog's
            return
        db.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK})
    names = check(db, where)
    current = revision(db, names)
    if current != HEAD:
        role = (db.execute(text("SELECT current_user")).scalar()
                if db.dialect.name == "postgresql" else None)
        try:
            if not names:  # a new store
                tables.metadata.create_all(db)
                _stamp(db, names)
            else:
                _upgrade(db, where, current)
        except DBAPIError as error:
            if role is None or getattr(error.orig, "sqlstate", None) != INSUFFICIENT_PRIVILEGE:
                raise
            raise StoreError(where, _not_allowed(role, names, current, why(error))) from None
    if db.execute(select(tables.store_info.c.value).where(tables.store_info.c.key == "id")
                  ).first() is None:
        db.execute(tables.store_info.insert().values(key="id", value=uuid.uuid4().hex))


def _not_allowed(role: str, names: list[str], current: str | None, reason: str) -> str:
    """Why a role that may not make or alter tables cannot write a store its first writer makes,
    or an older anatomy's, which is upgraded before it is written: PostgreSQL's own words name
    neither. "cannot be written", as a read-only file's: the dashboard shows it read-only."""
    if not names:
        return (f"it cannot be written by the role {role}, which may not make anatomy's tables"
                f" in this database ({reason}): run anatomy once as a role that may (its owner),"
                f" or grant {role} CREATE on the schema")
    made = (f"schema revision {current}" if current is not None
            else "before schema revisions were kept")
    return (f"it cannot be written by the role {role}: an older anatomy made it ({made}), which"
            f" this one upgrades to {HEAD} before it writes, and {role} may not ({reason}): run"
            " anatomy once as its tables' owner to upgrade it")


def _at_head(db: Connection) -> bool:
    """A PostgreSQL store at this release's revision (and so anatomy's, with its id)."""
    found = db.execute(text(f"SELECT to_regclass('{VERSION_TABLE}') IS NOT NULL")).scalar()
    return bool(found) and db.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")
                                      ).scalar() == HEAD


def _stamp(db: Connection, names: list[str]) -> None:
    if VERSION_TABLE not in names:
        db.execute(text(f"CREATE TABLE {VERSION_TABLE} (version_num VARCHAR(32) NOT NULL,"
                        f" CONSTRAINT {VERSION_TABLE}_pkc PRIMARY KEY (version_num))"))
    db.execute(text(f"DELETE FROM {VERSION_TABLE}"))
    db.execute(text(f"INSERT INTO {VERSION_TABLE} VALUES (:head)"), {"head": HEAD})


def _upgrade(db: Connection, where: Path | ServerUrl, current: str | None) -> None:
    from alembic.runtime.environment import EnvironmentContext

    refuse_newer(where, current)
    scripts = _scripts()

    def steps(revision, context):
        return scripts._upgrade_revs("head", revision)

    with EnvironmentContext(_config(), scripts, fn=steps,
                            destination_rev="head") as environment:
        environment.configure(connection=db, target_metadata=tables.metadata)
        environment.run_migrations()

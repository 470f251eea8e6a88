"""alembic's migrations of the store's schema, run by store/schema.py (not by an env.py): each
revision in versions/ brings a store from the one before."""

"""`python -m anatomy`: run, predict, sweep, watch, runs, show, rename, tag, delete, export,
import — the engine, headless — and dashboard, which starts Streamlit's own CLI on the
dashboard's entry. One module per command (as accelerate's `commands/`), assembled by `entry`."""

from anatomy.cli.entry import main, parser

__all__ = ["main", "parser"]

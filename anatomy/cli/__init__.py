"""`python -m anatomy`: run, predict, sweep, watch, runs, show, rename, tag, delete, export,
import — the engine, headless. One module per command (as accelerate's `commands/`), assembled
by `entry`."""

from anatomy.cli.entry import main, parser

__all__ = ["main", "parser"]

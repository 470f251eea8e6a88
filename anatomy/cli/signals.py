"""Ctrl-C, SIGTERM and SIGHUP while a run or a sweep trains: a Stop, not a dead CLI; Ctrl-Z: the
training pauses with the CLI."""

from __future__ import annotations

import signal
from collections.abc import Callable

from anatomy.engine.lifeline import stop_as_a_job

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL_SECONDS = 0.2  # how often a command that follows a run or a sweep looks again


class StopSignals:
    """While a run or sweep trains: Ctrl-C, SIGTERM and SIGHUP each ask for a Stop — as the
    dashboard's button does — instead of killing the CLI and leaving its processes. `on_stop` is
    called in the handler (it must only mark the stop); the loop does the stopping.

    Ctrl-Z (SIGTSTP) stops the CLI as a terminal's job, and its training with it: `on_pause(True)`
    before the CLI stops, `on_pause(False)` once it is continued (fg, bg). The worker leads a
    process group of its own, which the terminal's signal does not reach: it trained on, unseen,
    while the job was stopped."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.on_stop: Callable[[], None] | None = None
        self.on_pause: Callable[[bool], None] | None = None
        self._saved: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum
        if self.on_stop is not None:
            self.on_stop()

    def _suspend(self, signum, frame) -> None:
        stop_as_a_job(lambda paused: self.on_pause is not None and self.on_pause(paused))

    def __enter__(self) -> StopSignals:
        for sig in STOP_SIGNALS:
            self._saved[sig] = signal.signal(sig, self._handle)
        self._saved[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, self._suspend)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name

    def exit_code(self) -> int:
        return 128 + self.received

    def reason(self) -> str:
        """Why the run stopped, as it is recorded."""
        words = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM",
                 signal.SIGHUP: "SIGHUP: its terminal was closed"}
        return f"stopped by {words.get(self.received, self.name)}"

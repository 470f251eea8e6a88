"""What tests share to wait for a condition, to find a free port, to tell a live process and to
read a command's error: one way each. A wait says what it awaited when it gives up; a test never
sleeps for a fixed time in place of a condition."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil

T = TypeVar("T")
POLL_SECONDS = 0.05  # often enough for a test's pace, rarely enough to leave the CPU to what it waits on


def within(seconds: float, condition: Callable[[], T], every: float = POLL_SECONDS) -> T:
    """`condition()`'s first true value, asked every `every` s until `seconds` have passed, else
    its last (false) value: for a caller that decides itself what a time-out means."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(every)


def wait_until(condition: Callable[[], T], seconds: float, awaited: str, *,
               every: float = POLL_SECONDS, process: subprocess.Popen | None = None,
               seen: Callable[[], object] | None = None) -> T:
    """`condition()`'s first true value, asked every `every` s. The test fails, saying what it
    `awaited` (and what it had `seen` by then), once `seconds` pass without one, or as soon as
    `process`, the one that was to bring it about, has ended (with what it printed, where it was
    captured)."""
    ended: list[int] = []

    def met() -> T | bool:
        value = condition()
        if not value and process is not None and process.poll() is not None:
            ended.append(process.returncode)
            return True
        return value

    value = within(seconds, met, every)
    if value and not ended:
        return value
    why = (f"{_name(process)} ended with code {ended[0]} first{_output(process)}" if ended
           else f"not within {seconds:g} s")
    raise AssertionError(f"waited for {awaited}: {why}" + (f"\nseen: {seen()}" if seen else ""))


def _name(process: subprocess.Popen) -> str:
    args = process.args if isinstance(process.args, (list, tuple)) else [process.args]
    return " ".join(str(a) for a in args)[:200]


def _output(process: subprocess.Popen) -> str:
    """What an ended process printed, where the test captured it (a pipe it can still read)."""
    try:
        out, err = process.communicate(timeout=10)
    except (subprocess.TimeoutExpired, ValueError, OSError):
        return ""  # a child of it still holds the pipe open, or it was read already
    printed = "".join(p.decode(errors="replace") if isinstance(p, bytes) else p
                      for p in (out, err) if p)
    return f":\n{printed[-3000:]}" if printed else ""


def free_port() -> int:
    """A TCP port free on this machine now (the system's choice): each worker of a parallel
    session gets its own."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def alive(process: psutil.Process) -> bool:
    """Running, and not a zombie (a zombie holds no memory, no device and no lock)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def one_line(err: str) -> str:
    """A command's standard error as the user must see a refusal: one line, "error: …", no
    traceback. Returns it, to compare with the words expected."""
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def resnet_config(folder: Path, width: int = 8, image_size: int = 32) -> Path:
    """A small ResNet's config.json in `folder` (two basic stages, `width` then twice as many
    channels, ten classes): the convolution network the prediction's workspace tests trace."""
    config = {"model_type": "resnet", "architectures": ["ResNetForImageClassification"],
              "embedding_size": width, "hidden_sizes": [width, 2 * width], "depths": [1, 1],
              "layer_type": "basic", "image_size": image_size, "num_labels": 10}
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


def transformers_below(version: str) -> bool:
    """Whether the installed transformers is older than `version`: a test of a model that
    transformers broke or lacked before it is skipped at the package's floor (make floors)."""
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__) < Version(version)


def skip_unknown_model_types(*model_types: str) -> None:
    """Skips the test where the installed transformers lacks one of `model_types` (a model added
    after the package's floor, make floors)."""
    import pytest
    import transformers
    from transformers import CONFIG_MAPPING

    missing = [t for t in model_types if t not in CONFIG_MAPPING]
    if missing:
        pytest.skip(f"transformers {transformers.__version__} has no {', '.join(missing)}")


def installed_anatomy(folder: Path, *requires: str) -> Path:
    """A folder holding anatomy's metadata as pip writes it for an install, with `requires` as
    its requirements: first on the path, it is the environment's anatomy (analysis/libraries.py
    reads its floors there)."""
    info = folder / "anatomy-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("\n".join([
        "Metadata-Version: 2.1", "Name: anatomy", "Version: 0.1.0",
        *(f"Requires-Dist: {line}" for line in requires), "Provides-Extra: dashboard", ""]))
    return folder


def on_screen(text: str) -> list[str]:
    """What a terminal shows of `text`: each line, every carriage return drawing over it from
    its start."""
    shown = []
    for line in text.split("\n"):
        cells: list[str] = []
        for part in line.split("\r"):
            cells[:len(part)] = part
        shown.append("".join(cells).rstrip())
    return shown

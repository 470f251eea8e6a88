"""What the tests of real processes share: the real runs that several tests read, one Chromium
for the session, a dashboard server started as a user would, a disk that really fills, a user's
own Trainer script, and how a test sees that no process of a run is left."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from anatomy.analysis.options import RunOptions
from anatomy.engine.manager import RunManager
from anatomy.store import Store
from tests.conftest import PROJECT
from tests.helpers import alive, free_port, wait_until, within
from tools.browser import ARGS, CHROMIUM, end, healthy

ARTIFACTS = PROJECT / "test-artifacts"  # the browser tests' screenshots
GONE_SECONDS = 20  # a process of a run is gone within this after its end, on a loaded machine
# What a test allows a stop, a kill or an end to take: long enough that only a hang fails it on a
# loaded machine (CI's, a laptop's), never a speed. Timings belong in bench/.
HANG_SECONDS = 60


@pytest.fixture(scope="session")
def _chromium_session():
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def chromium(_chromium_session):
    """Debian's Chromium, launched once a session (seconds each time); what a test opens in it
    (`chromium.new_page(...)`: a page in a context of its own) is closed when the test ends."""
    yield _chromium_session
    for context in _chromium_session.contexts:
        context.close()


@pytest.fixture(scope="session")
def recorded(tmp_path_factory):
    """recorded(options) -> (store, run id): a real run of `options`, made once a session in a
    store of its own and read by every test that asks for the same options. Those tests only
    read it; a test that changes a run makes its own. pytest-xdist's workers share the runs
    (the lock recipe of xdist's docs: their base folders' parent is the session's): the first
    to ask records, under a lock that the others wait on, then read."""
    base = tmp_path_factory.getbasetemp()
    folder = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    managers: list[RunManager] = []
    runs: dict[RunOptions, tuple[Store, int]] = {}

    def record(options: RunOptions) -> tuple[Store, int]:
        if options not in runs:
            name = hashlib.sha256(repr(options).encode()).hexdigest()[:16]
            path, made = folder / f"recorded-{name}.sqlite", folder / f"recorded-{name}.id"
            with open(folder / f"recorded-{name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
                if not made.exists():
                    managers.append(RunManager(Store(path)))
                    run_id = managers[-1].start(options)
                    managers[-1].wait(run_id, timeout=300)
                    made.write_text(str(run_id))
            runs[options] = Store(path), int(made.read_text())
        return runs[options]

    yield record
    for manager in managers:
        manager.stop_all()


# --- processes: which are left, by what name ---

def left(processes: list[psutil.Process], timeout: float = GONE_SECONDS) -> list[psutil.Process]:
    """Those of `processes` still alive after `timeout`."""
    within(timeout, lambda: not any(alive(p) for p in processes), every=0.1)
    return [p for p in processes if alive(p)]


def trainer_folders(folder: Path) -> list[Path]:
    """The Trainer's output folders (engine/training.py) in `folder`, a process's temporary
    directory: the device locks' folder is another's."""
    return [p for p in folder.glob("anatomy-*") if p.name != "anatomy-locks"]


def name_of(process: psutil.Process) -> str | None:
    try:
        return process.name()
    except psutil.Error:
        return None


def kill_all(processes: list[psutil.Process]) -> None:
    """Kill what a failed test left: by pid, only processes it started (psutil refuses a pid that
    now names another process)."""
    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass


# --- a dashboard server, as `anatomy dashboard` starts one ---

def serve(argv: list[str], *, cwd: Path, log_path: Path, env: dict | None = None,
          timeout: float = 90, start_new_session: bool = False):
    """Start `argv` (an `anatomy dashboard` command line, its `--port` given by the caller as
    `{port}`) and wait until Streamlit answers its health check. Returns (process, url, log).
    `start_new_session`: the server leads a process group of its own, as a terminal's job or a
    service does."""
    port = free_port()
    log = log_path.open("w+")
    process = subprocess.Popen([arg.format(port=port) for arg in argv], cwd=cwd, env=env,
                               stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=start_new_session)
    url = f"http://localhost:{port}"
    try:
        wait_until(lambda: healthy(url), timeout, "the dashboard to answer its health check",
                   every=0.3, process=process)
    except AssertionError as never:
        process.kill()
        log.seek(0)
        pytest.fail(f"the dashboard did not start ({never}):\n{log.read()}")
    return process, url, log


def stop(process: subprocess.Popen, log) -> str:
    """End the server (SIGTERM, then SIGKILL after 20 s); what it logged."""
    end(process)
    log.seek(0)
    text = log.read()
    log.close()
    return text


class Terminal:
    """An interactive bash in a pseudo-terminal of its own: job control as a user has it (Ctrl-Z
    stops the foreground job, `fg` continues it). What it prints is read as it comes, so that
    nothing it runs blocks on a full terminal."""

    def __init__(self, cwd: Path, env: dict | None = None):
        import pty

        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the shell
            os.chdir(cwd)
            os.execvpe("bash", ["bash", "--norc", "--noprofile", "-i"], env or dict(os.environ))
        self.output = b""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # the shell has ended
                return
            if not chunk:
                return
            self.output += chunk

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        os.close(self.fd)


def stopped(process: psutil.Process) -> bool:
    """Stopped as a job is (SIGSTOP, SIGTSTP), not ended."""
    return process.status() == psutil.STATUS_STOPPED


# --- a full disk ---

@pytest.fixture
def small_disk(tmp_path):
    """A 64 MB tmpfs (as root, where mount works): a disk that really fills."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs",
                                            str(mount)], capture_output=True).returncode:
        pytest.skip("a tmpfs needs root and mount (tests/unit/test_store_faults.py's page limit "
                    "stands in)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, name: str = "filler") -> Path:
    """Take every byte left on `disk`."""
    filler = disk / name
    with open(filler, "wb", buffering=0) as out:  # unbuffered: closing has nothing left to write
        for size in (65536, 1):
            try:
                while True:
                    out.write(b"\0" * size)
            except OSError:
                pass
    return filler


def checkpoint(store_path: Path) -> None:
    """The store's WAL folded into it and truncated: no slack left to write into."""
    with sqlite3.connect(store_path, timeout=30) as db:
        # busy (1) while a reader holds an older snapshot: asked again until none does
        wait_until(lambda: not db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0],
                   HANG_SECONDS, "the store's WAL folded in and truncated")


# --- a user's own script ---

# A Trainer script with nothing of anatomy but the callback, and its own collator padding each
# batch to its longest example: a tiny BERT from its config, 24 examples of 16 to 120 tokens, the
# first one 16. It prints the examples' lengths last.
PADDED_TRAINER_SCRIPT = """
import random

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import anatomy

random.seed(0)
lengths = [16] + [random.randint(16, 120) for _ in range(23)]
examples = [{"input_ids": [random.randint(5, 999) for _ in range(n)], "labels": n % 2}
            for n in lengths]


def pad(batch):
    longest = max(len(e["input_ids"]) for e in batch)
    ids = torch.zeros(len(batch), longest, dtype=torch.long)
    mask = torch.zeros(len(batch), longest, dtype=torch.long)
    for row, example in enumerate(batch):
        ids[row, :len(example["input_ids"])] = torch.tensor(example["input_ids"])
        mask[row, :len(example["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask,
            "labels": torch.tensor([e["labels"] for e in batch])}


config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=256, vocab_size=1000, max_position_embeddings=128)
arguments = TrainingArguments(output_dir="out", per_device_train_batch_size=8,
                              num_train_epochs=1, logging_steps=1, report_to="none",
                              save_strategy="no", disable_tqdm=True, use_cpu=True)
trainer = Trainer(model=BertForSequenceClassification(config), args=arguments,
                  train_dataset=examples, data_collator=pad,
                  callbacks=[anatomy.AnatomyCallback()])
trainer.train()
print(lengths)
"""


TRAINER_EXAMPLE = PROJECT / "examples" / "trainer_script.py"
ATTACHED = "anatomy.AnatomyCallback.attach(trainer)"


def trainer_example(folder: Path, predict: bool) -> Path:
    """examples/trainer_script.py as it is, or (`predict=False`) a copy in `folder` whose callback
    works out no predicted peak: the peak's child interpreter (torch, transformers and a traced
    step: ~10 CPU s) is no part of what a test that never reads the peak checks."""
    if predict:
        return TRAINER_EXAMPLE
    text = TRAINER_EXAMPLE.read_text()
    assert ATTACHED in text, "the example attaches its callback otherwise: say predict=False there"
    copy = folder / "trainer_script.py"
    copy.write_text(text.replace(ATTACHED, ATTACHED[:-1] + ", predict=False)"))
    return copy


# --- the package as pip builds it ---

@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The clone built into a wheel as `pip install <clone>` builds it (its own build
    environment, no dependency), once a session (per pytest-xdist worker): the packaging tests
    install it into fresh virtualenvs."""
    folder = tmp_path_factory.mktemp("wheel")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                             str(folder), str(PROJECT)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (built,) = folder.glob("anatomy-*.whl")
    return built

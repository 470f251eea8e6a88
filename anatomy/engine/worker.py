"""The training worker: anatomy's own run, in a spawned process (never forked).

It marks the baseline before torch is loaded (without a GPU: before torch is loaded at all), then
trains one process (engine/training.py) or launches several (engine/ranks.py). Everything it says
goes on its queue as protocol messages (engine/protocol.py), through a `Reporter`.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time

from anatomy.analysis import models
from anatomy.analysis.data import Tokenized
from anatomy.analysis.options import RunOptions
from anatomy.analysis.transformers_index import index_once
from anatomy.engine.lifeline import Lifeline
from anatomy.engine.reporter import Reporter
from anatomy.engine.training import (
    dummy_dataset,
    guarded,
    progress_bars_lock,
    text_dataset,
    train_phases,
)
from anatomy.vocabulary import Level, Phase


def compiled_at_every_start(package: str = "torch") -> bool:
    """Python compiles `package` from its source each time a process imports it: no bytecode
    lies beside it (an install that skipped it, as uv's does by default) and the environment
    forbids writing any (PYTHONDONTWRITEBYTECODE, common in container images). On the H200's
    image that made a 1 B model's start-up 13-16 s where 6-7 s is the same run with bytecode
    (docs/BENCHMARKS.md, "Start-up")."""
    if not sys.dont_write_bytecode:
        return False
    try:
        spec = importlib.util.find_spec(package)  # finds it without importing it
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    return not os.path.exists(importlib.util.cache_from_source(spec.origin))


def train(queue, options: RunOptions, t0: float, use_cuda: bool, dwell: float,
          texts: Tokenized | None = None, output_dir: str | None = None) -> int:
    """The run's training; `texts`: a dataset's, tokenized (analysis/data.py), else the dummy
    data; `output_dir`: the Trainer's, its caller's to remove (training.output_folder)."""
    reporter = Reporter(queue, t0, dwell)
    reporter.begin(Phase.BASELINE)
    if compiled_at_every_start():
        reporter.tell(Level.INFO, "torch is compiled from its source at every start here (no bytecode "
                      "beside it and PYTHONDONTWRITEBYTECODE set): seconds before the kernel phase; "
                      "`python -m compileall -q` on its folder, or a PYTHONPYCACHEPREFIX, keeps it")

    def work() -> int:
        progress_bars_lock()
        spec = models.resolve(options.model)
        dataset = dummy_dataset(options, spec) if texts is None else \
            text_dataset(options, spec, texts)
        time.sleep(dwell)
        reporter.end(Phase.BASELINE)
        if options.distributed:
            from anatomy.engine.ranks import launch_ranks

            return launch_ranks(reporter, options, spec, dataset, use_cuda, output_dir)
        return train_phases(reporter, options, spec, dataset, use_cuda, output_dir=output_dir)

    return guarded(reporter, work)


def main(queue, options: RunOptions, t0: float, cuda_device: str | None, dwell: float,
         lifeline: Lifeline | None = None, texts: Tokenized | None = None,
         output_dir: str | None = None) -> None:
    """Process target. `cuda_device` is the CUDA_VISIBLE_DEVICES entry to train on, or None;
    `lifeline` ties it to the manager (its own process group, dies with its parent); `texts` the
    dataset it trains on, tokenized (None: the dummy data); `output_dir` the Trainer's, the
    manager's to remove however the worker ends."""
    if lifeline is not None:
        lifeline.attach()
    # No Ctrl-C reaches the worker (its own process group): a SIGINT sent to it is a kill, told
    # as one ("killed by SIGINT"), not a KeyboardInterrupt whose traceback would be the error.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    index_once()  # transformers' models read once, not twice, when training loads them
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the Hub is never needed: configs ship here
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if cuda_device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_device  # before torch: cuda:0 is our GPU
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    code = train(queue, options, t0, cuda_device is not None, dwell, texts, output_dir)
    queue.close()
    queue.join_thread()  # everything we said reaches the collector before the exit status does
    sys.exit(code)

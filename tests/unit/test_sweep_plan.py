"""Sweeps: the plan, the batch-size ladder (with a scripted manager), stop, the grid, the device's
real lock held between runs. (Real tiny sweeps: tests/e2e/test_sweep.py.)"""

from __future__ import annotations

import re
import threading

import pytest

from anatomy.analysis.options import Checked, InvalidOptions, RunOptions
from anatomy.analysis.sweeps import (
    SweepGrid,
    SweepRun,
    grid,
    largest_fitting,
    parse_vary,
    plan,
    shown_value,
)
from anatomy.engine.manager import DeviceBusy, RunManager
from anatomy.engine.sweep import Sweep
from anatomy.store import Sample, Store
from anatomy.units import MIB
from anatomy.vocabulary import Status
from tests.conftest import TINY
from tests.helpers import wait_until


class Reservation:
    """A device held for a sweep, as RunManager.reserve gives one (its lock), without a lock file."""

    def __init__(self, key: str, holder: str):
        self.key, self.holder, self.held = key, holder, True

    def describe(self, text: str) -> None:
        assert self.held, "described after it was released"
        self.holder = text

    def release(self) -> None:
        self.held = False


class ScriptedManager:
    """RunManager's interface as a sweep uses it (device_key, reserve, start, wait, stop, front), without
    training: each run is written to a real store and ends at once with the status
    `outcome(options)` gives, or, for "hold", keeps running until it is stopped. Every run must be
    started with the sweep's reservation of its device."""

    def __init__(self, store: Store, outcome):
        self.store, self.outcome = store, outcome
        self.front = "a test"  # the program it runs in, as a busy device's holder names it
        self.started: list[RunOptions] = []
        self.stopped: list[int] = []
        self.reservations: list[Reservation] = []
        self._ended: dict[int, threading.Event] = {}

    def device_key(self, options: RunOptions) -> str:
        return "cpu"  # a machine without a GPU: one device

    def reserve(self, options: Checked, holder: str) -> Reservation:
        reservation = Reservation(self.device_key(options), holder)
        self.reservations.append(reservation)
        return reservation

    def start(self, options: Checked | RunOptions, name: str | None = None,
              sweep: str | None = None, reservation: Reservation | None = None) -> int:
        options = options.options if isinstance(options, Checked) else options
        assert reservation is not None and reservation.held, "a sweep's run without its device"
        assert reservation.key == self.device_key(options)
        run_id = self.store.create_run(options.to_dict(), "cpu-rss", "rss", 0, {}, name=name,
                                       sweep=sweep)
        self.started.append(options)
        self._ended[run_id] = threading.Event()
        status = self.outcome(options)
        if status != "hold":
            self._end(run_id, options, status)
        return run_id

    def _end(self, run_id: int, options: RunOptions, status: str) -> None:
        self.store.write(run_id, samples=[
            Sample(0.0, 0, 100 * MIB, None, None, None),
            Sample(1.0, 0, (100 + options.batch_size) * MIB, None, None, None)])
        if status == "completed":
            self.store.update_run(run_id, summary={"time_s": 2.0,
                                                   "samples_per_second": 8.0 * options.batch_size})
        self.store.finish(run_id, status)
        self._ended[run_id].set()

    def wait(self, run_id: int, timeout: float | None = None) -> str:
        self._ended[run_id].wait(timeout)
        return self.store.run(run_id).status

    def stop(self, run_id: int, reason: str = "stopped by the user") -> bool:
        self.stopped.append(run_id)
        options = RunOptions.from_dict(self.store.run(run_id).options)
        self._end(run_id, options, "stopped")
        return True


def oom_above(limit: int, fp32_factor: int = 1):
    def outcome(options: RunOptions) -> str:
        factor = fp32_factor if options.precision == "fp32" else 1
        return "oom" if options.batch_size * factor > limit else "completed"
    return outcome


def test_plan_is_the_product_with_a_ladder_per_value_of_the_other_option():
    planned = plan(TINY, {"batch_size": [4, 1, 2, 2], "precision": ["fp32", "bf16"]},
                   until_oom=False, gpu_count=0)
    assert [(o.options.precision, o.options.batch_size) for o in planned] == [
        ("fp32", 1), ("fp32", 2), ("fp32", 4), ("bf16", 1), ("bf16", 2), ("bf16", 4)]
    assert all(o.options.seq_len == 32 and o.options.preset == "tiny" for o in planned)


@pytest.mark.parametrize("vary, until_oom, message", [
    ({"batch_size": [2, 0]}, False, "batch_size: 0 is out of range: 1 to 4096"),
    ({"precision": ["fp32", "fp16"]}, False, "precision: fp16 needs a GPU"),
    ({"seq_len": [32, 1024]}, False, "seq_len: 1024 is out of range for tiny: 1 to 512"),
    ({"precision": ["fp32", "bf16"]}, True, "until_oom: needs batch_size among the varied options"),
    ({}, False, "vary: choose one or two options to vary"),
    ({"batch_size": [1], "precision": ["bf16"], "optim": ["sgd"]}, False,
     "vary: at most 2 options, got 3: batch-size, precision, optim"),  # as the flags name them
    ({"batch_size": []}, False, "batch_size: no values to try"),
    ({"colour": ["red"]}, False, "colour: not an option"),
])
def test_a_wrong_plan_is_refused_before_anything_starts(vary, until_oom, message, store):
    manager = ScriptedManager(store, oom_above(10**6))
    with pytest.raises(InvalidOptions) as refused:
        Sweep(manager, TINY, vary, until_oom, gpu_count=0)
    assert any(message in m for m in refused.value.errors.values()), refused.value.errors
    assert manager.started == [] and store.sweeps() == []
    assert manager.reservations == []  # no device taken either


def test_vary_is_parsed_by_each_options_type():
    assert parse_vary(["batch-size=1,2, 4", "gradient-checkpointing=off,ON,true,false"]) == {
        "batch_size": [1, 2, 4], "gradient_checkpointing": [False, True, True, False]}
    assert parse_vary(["optim=sgd,adafactor"]) == {"optim": ["sgd", "adafactor"]}
    assert parse_vary(["lora-dropout=0,0.05, 0.1"]) == {"lora_dropout": [0, 0.05, 0.1]}
    with pytest.raises(InvalidOptions) as refused:
        parse_vary(["batch-size=1,two", "lora-dropout=0.1,much", "gradient-checkpointing=maybe",
                    "colour=red", "seq-len",
                    "grad-accum=1", "grad_accum=2"])
    assert list(refused.value.errors.values()) == [
        "batch-size: 'two' is not a whole number",
        "lora-dropout: 'much' is not a number",
        "gradient-checkpointing: 'maybe' is not on, off, true or false",
        "--vary colour=red: 'colour' is not an option (one of model, batch-size, seq-len, "
        "target-len, dataset-size, epochs, max-steps, precision, weights, attention, "
        "gradient-checkpointing, grad-accum, optim, label-smoothing, "
        "seed, sample-rate, gpu, processes, strategy, profile-steps, lora-rank, lora-targets, "
        "lora-dropout, frozen, dataset, split, text-column, tokenizer, padding, max-length)",
        "--vary seq-len: write OPTION=V1,V2,… (e.g. batch-size=1,2,4)",
        "--vary grad_accum=2: grad_accum is varied twice"]


def test_a_lists_empty_value_is_a_run_of_its_own_and_said_as_what_it_means(store):
    """`--vary frozen=,model.embed_tokens`: the run with nothing frozen beside the frozen one
    (the empty value was dropped: one run planned, no baseline); a stray comma elsewhere is
    still dropped."""
    assert parse_vary(["frozen=,model.embed_tokens", "batch-size=2,,4"]) == {
        "frozen": ["", "model.embed_tokens"], "batch_size": [2, 4]}
    planned = plan(TINY, parse_vary(["frozen=,bert.embeddings"]), False, gpu_count=0)
    assert [p.options.frozen for p in planned] == [(), ("bert.embeddings",)]
    assert [shown_value("frozen", v) for v in ((), ("a", "b"), "a,b", "")] == [
        "none", "a,b", "a,b", "none"]
    assert shown_value("lora_targets", ()) == "the architecture's"
    assert shown_value("batch_size", 4) == 4


def test_until_oom_doubles_past_the_list_until_a_run_is_out_of_memory(store):
    manager = ScriptedManager(store, oom_above(16))
    events = []
    sweep = Sweep(manager, TINY, {"batch_size": [1, 2]}, until_oom=True, gpu_count=0,
                  on_event=events.append)
    assert sweep.run() == "completed"
    assert [o.batch_size for o in manager.started] == [1, 2, 4, 8, 16, 32]
    result = grid(Store(store.path), sweep.id)  # the store alone: what a page reads
    assert [(r.values["batch_size"], r.status) for r in result.runs] == [
        (1, "completed"), (2, "completed"), (4, "completed"), (8, "completed"),
        (16, "completed"), (32, "oom")]
    assert result.largest_fitting == 16
    assert result.status == "completed" and result.planned == 2 and result.until_oom
    assert result.runs[2].peak_mb == 104 and result.runs[2].samples_per_second == 32.0
    assert all(run.sweep == store.sweep(sweep.id).key for run in store.runs())
    assert [(e.kind, e.index) for e in events[:3]] == [("start", 1), ("end", 1), ("start", 2)]
    # The device was held for the whole sweep, in its name, and given back at its end.
    (reservation,) = manager.reservations
    assert reservation.holder.startswith(f"sweep {sweep.id} of {store.path} (a test, pid ")
    assert not reservation.held


def test_until_oom_ends_at_the_largest_batch_size_an_option_accepts(store):
    manager = ScriptedManager(store, oom_above(10**6))
    assert Sweep(manager, TINY, {"batch_size": [1024]}, until_oom=True, gpu_count=0).run() == "completed"
    assert [o.batch_size for o in manager.started] == [1024, 2048, 4096]


def test_the_first_oom_of_a_ladder_skips_its_larger_batch_sizes(store):
    # fp32 needs twice the memory of bf16 here: its ladder ends at 8, bf16's at 16
    manager = ScriptedManager(store, oom_above(8, fp32_factor=2))
    events = []
    sweep = Sweep(manager, TINY, {"precision": ["fp32", "bf16"], "batch_size": [2, 4, 8, 16, 32]},
                  gpu_count=0, on_event=events.append)
    assert sweep.run() == "completed"
    assert [(o.precision, o.batch_size) for o in manager.started] == [
        ("fp32", 2), ("fp32", 4), ("fp32", 8), ("bf16", 2), ("bf16", 4), ("bf16", 8), ("bf16", 16)]
    assert [e.values for e in events if e.kind == "skip"] == [
        {"precision": "fp32", "batch_size": 16}, {"precision": "fp32", "batch_size": 32},
        {"precision": "bf16", "batch_size": 32}]
    result = grid(store, sweep.id)
    assert result.largest_fitting == {"fp32": 4, "bf16": 8}
    assert result.skipped == 3 and result.planned == 10


def test_a_failed_run_is_a_result_not_the_end_of_its_ladder(store):
    manager = ScriptedManager(store, lambda o: "failed" if o.batch_size == 2 else "completed")
    sweep = Sweep(manager, TINY, {"batch_size": [1, 2, 4]}, gpu_count=0)
    assert sweep.run() == "completed"
    assert [r.status for r in grid(store, sweep.id).runs] == ["completed", "failed", "completed"]
    assert grid(store, sweep.id).largest_fitting == 4


def test_without_batch_size_every_combination_runs_and_nothing_fits_or_not(store):
    manager = ScriptedManager(store, lambda o: "oom" if o.gradient_checkpointing is False else "completed")
    sweep = Sweep(manager, TINY, {"gradient_checkpointing": [False, True], "grad_accum": [1, 2]},
                  gpu_count=0)
    assert sweep.run() == "completed"
    assert len(manager.started) == 4
    assert grid(store, sweep.id).largest_fitting is None


def test_stop_stops_the_current_run_and_drops_the_rest(store):
    manager = ScriptedManager(store, lambda o: "hold")
    sweep = Sweep(manager, TINY, {"batch_size": [1, 2, 4]}, until_oom=True, gpu_count=0)
    sweep_id = sweep.start()
    wait_until(lambda: manager.started, 10, "the sweep's first run to start", every=0.01)
    assert store.sweep(sweep_id).status == "running"  # what a page sees meanwhile
    sweep.stop()
    assert sweep.wait(10) == "stopped"
    assert len(manager.started) == 1 and manager.stopped == [store.runs()[0].id]
    assert [r.status for r in grid(store, sweep_id).runs] == ["stopped"]
    assert store.sweep(sweep_id).status == "stopped" and store.sweep(sweep_id).ended_at
    assert not manager.reservations[0].held  # a stopped sweep gives its device back


def test_a_busy_device_fails_the_sweep_and_says_why(store):
    class Busy(ScriptedManager):
        def start(self, options, name=None, sweep=None, reservation=None):
            raise DeviceBusy("another run is training on this machine: stop it or wait until it ends")

    manager = Busy(store, None)
    sweep = Sweep(manager, TINY, {"batch_size": [1, 2]}, gpu_count=0)
    assert sweep.run() == "failed"
    assert "another run is training" in store.sweep(sweep.id).error
    assert not manager.reservations[0].held


def test_a_device_taken_before_the_sweep_starts_records_nothing(store):
    class Taken(ScriptedManager):
        def reserve(self, options, holder):
            raise DeviceBusy("this machine is busy: run 3 (pid 42)")

    manager = Taken(store, oom_above(10**6))
    sweep = Sweep(manager, TINY, {"batch_size": [1, 2]}, gpu_count=0)
    with pytest.raises(DeviceBusy, match="busy: run 3"):
        sweep.run()
    assert manager.started == [] and store.sweeps() == []


def test_a_sweep_holds_its_device_between_its_runs(store):
    """The device's real lock: while the sweep lasts, a run or another sweep on that device is
    refused, naming the sweep; once it has ended, a run may start."""
    real = RunManager(store)

    class Locking(ScriptedManager):  # the real lock, scripted runs
        def device_key(self, options):
            return real.device_key(options)

        def reserve(self, options, holder):
            lock = real.reserve(options, holder)
            self.reservations.append(lock)
            return lock

    manager = Locking(store, lambda o: "hold")
    sweep = Sweep(manager, TINY, {"batch_size": [1, 2]}, gpu_count=0)
    sweep_id = sweep.start()
    try:
        wait_until(lambda: manager.started, 10, "the sweep's first run to start", every=0.01)
        held = rf"is busy: sweep {sweep_id} of {re.escape(str(store.path))} \(a test, pid \d+\)"
        with pytest.raises(DeviceBusy, match=held):
            real.start(TINY)
        second = Sweep(Locking(store, lambda o: "completed"), TINY, {"batch_size": [4]},
                       gpu_count=0)
        with pytest.raises(DeviceBusy, match=rf"is busy: sweep {sweep_id} "):
            second.run()
        assert [s.id for s in store.sweeps()] == [sweep_id]  # the refused one left no trace
    finally:
        sweep.stop()
        assert sweep.wait(10) == "stopped"
    assert not manager.reservations[0].held
    again = Locking(store, lambda o: "completed")
    assert Sweep(again, TINY, {"batch_size": [4]}, gpu_count=0).run() == "completed"




def _confirmed(*outcomes: tuple[int, str]) -> SweepGrid:
    runs = [SweepRun(run=i, values={"batch_size": size}, status=status, peak_mb=1,
                     samples_per_second=None, time_s=None)
            for i, (size, status) in enumerate(outcomes, 1)]
    vary = {"batch_size": [size for size, _ in outcomes]}
    return SweepGrid(1, None, Status.COMPLETED, None, vary, False, len(runs), 0, runs,
                     largest_fitting(vary, runs))


def test_from_prediction_says_what_its_two_runs_make_of_the_prediction(capsys):
    """On the H200 EfficientNet-B0's predicted 3,264 ran and so did 3,265: the sweep printed
    "largest batch size that fit: 3265" as though that were the edge. Where nothing ran out of
    memory the answer is a floor, and --from-prediction says whether the prediction was the
    largest that fits, below or above."""
    from anatomy.cli.sweep import _print_grid, _verdict

    both = _confirmed((3264, Status.COMPLETED), (3265, Status.COMPLETED))
    _print_grid(both)
    assert capsys.readouterr().out.endswith(
        "largest batch size that fit: ≥ 3265 (no run ran out of memory)\n")
    assert _verdict(both, 3264) == "the prediction was below: 3265 fits too"
    edge = _confirmed((1711, Status.COMPLETED), (1712, Status.OOM))
    _print_grid(edge)
    assert capsys.readouterr().out.endswith("largest batch size that fit: 1711\n")
    assert _verdict(edge, 1711) == \
        "the prediction is the largest that fits: 1711 ran, 1712 did not"
    above = _confirmed((2362, Status.OOM))  # the next skipped: a smaller one ran out
    assert _verdict(above, 2362) == "the prediction was above: 2362 ran out of memory"
    assert _verdict(_confirmed((5, Status.FAILED), (6, Status.COMPLETED)), 5) is None


def test_a_sweep_stopped_in_its_first_run_knows_no_largest_batch_size(capsys):
    """Stopped (Ctrl-C) during its first run, the sweep said "largest batch size that fit: none",
    as though every size had run out of memory."""
    from anatomy.cli.sweep import _print_grid

    _print_grid(_confirmed((2, Status.STOPPED)))
    assert capsys.readouterr().out.endswith(
        "largest batch size that fit: not known (no run completed)\n")
    _print_grid(_confirmed((2, Status.OOM)))
    assert capsys.readouterr().out.endswith("largest batch size that fit: none\n")


def test_a_sweep_of_a_quantized_config_says_its_weights_are_unquantized(tmp_path):
    """`sweep --model <a config saved with a BitsAndBytesConfig>` ran (and, --from-prediction,
    predicted) the weights unquantized without the word `run` and `predict` say."""
    from transformers import BitsAndBytesConfig, LlamaConfig

    from anatomy.cli.sweep import unquantized

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, vocab_size=128)
    config.quantization_config = BitsAndBytesConfig(load_in_4bit=True)
    config.save_pretrained(tmp_path / "qlora-base")
    quantized = str(tmp_path / "qlora-base")
    planned = plan(TINY, {"model": [quantized, "tiny"], "batch_size": [1, 2]}, False, 0)
    assert unquantized(planned) == [
        "model qlora-base: its quantization_config (bitsandbytes, 4-bit) is left out: the "
        "weights are unquantized"]
    assert unquantized(plan(TINY, {"batch_size": [1, 2]}, False, 0)) == []

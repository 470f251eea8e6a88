"""Whether a run fits its device and which limit decides (prediction/limits.py): its tensors, the
caching allocator's reserve, or NVML's total against the device; a run that does not fit is said
not to, with the largest batch size that does — by `predict`, the form's Predict and What fits?."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from anatomy.analysis.options import RunOptions
from anatomy.cli import main
from anatomy.prediction import max_batch_size, predict, replay
from anatomy.prediction.device_constants import DEFAULT
from anatomy.prediction.limits import judge
from anatomy.prediction.memory import CPU_PROCESS, Limit, recording_for, steps_measured

MIB = 2**20
# The device's memory all usable by CUDA, no edge margin: the capacity the allocator may reserve
# is the total less the context and what lives outside PyTorch, to the byte.
EXACT = replace(DEFAULT, usable_bytes=DEFAULT.total_bytes, edge_margin=0.0)
OPTIONS = RunOptions(model="tiny-gpt2", seq_len=512, batch_size=8)


def total_for(capacity: int) -> int:
    return capacity + EXACT.context_bytes + EXACT.outside_bytes


@pytest.fixture(scope="module")
def edges() -> tuple[int, int, int]:
    """The run's allocated peak, the least capacity the simulated caching allocator completes
    it in (releasing its cache where it must), and the reserve it keeps with no device around
    it: tensors < completes < reserve for this run."""
    recording = recording_for(OPTIONS, "cuda", EXACT)

    def measured(capacity):
        return replay.measure(replay.stream(recording, steps_measured(OPTIONS), 1), cuda=True,
                              capacity=capacity)

    free = measured(None)
    low, high = free.peak_allocated, free.peak_reserved
    while high - low > 4096:
        middle = (low + high) // 2
        low, high = (low, middle) if not measured(middle).out_of_memory else (middle, high)
    assert free.peak_allocated < high < free.peak_reserved
    return free.peak_allocated, high, free.peak_reserved


@pytest.mark.parametrize("where, fits, limit", [
    ("below the tensors", False, Limit.TENSORS),
    ("between the tensors and what the allocator completes in", False, Limit.RESERVE),
    ("between that and the reserve it keeps", True, Limit.NVML),
    ("above the reserve", True, None)])
def test_the_limit_that_decides_is_named(edges, where, fits, limit):
    tensors, completes, reserve = edges
    capacity = {"below the tensors": tensors - MIB,
                "between the tensors and what the allocator completes in":
                    (tensors + completes) // 2,
                "between that and the reserve it keeps": (completes + reserve) // 2,
                "above the reserve": reserve + MIB}[where]
    verdict = judge(OPTIONS, total=total_for(capacity), calibration=EXACT)
    assert (verdict.fits, verdict.sure, verdict.limit) == (fits, fits, limit)
    assert verdict.capacity == capacity and verdict.peak == tensors
    line = verdict.line("the GPU")
    assert line.startswith("fits the GPU" if fits else "does not fit the GPU")
    if limit == Limit.TENSORS:
        assert ": its tensors decide" in line
    if limit == Limit.RESERVE:
        assert ": the allocator's reserve decides" in line and verdict.refused > 0
    if not fits:  # said with the largest size that does
        largest = max_batch_size(OPTIONS, total=total_for(capacity), calibration=EXACT)
        assert verdict.largest.batch_size == largest.batch_size < OPTIONS.batch_size
        assert line.endswith(f"; the largest batch size that fits: {largest.batch_size}")
    if limit == Limit.NVML:  # nvidia-smi shows the reserve the device lets it keep
        assert "NVML's total decides" in line
        assert verdict.reserved < reserve and verdict.nvml_peak <= total_for(capacity)


def test_a_run_that_fits_only_without_the_margin_may_not(edges):
    tensors, completes, reserve = edges
    capacity = reserve + MIB
    margin = (capacity - (tensors + completes) // 2) / capacity
    verdict = judge(OPTIONS, total=total_for(capacity),
                    calibration=replace(EXACT, edge_margin=margin))
    assert (verdict.fits, verdict.sure, verdict.limit) == (True, False, Limit.MARGIN)
    assert verdict.line("the GPU").startswith("may not fit the GPU")
    assert verdict.largest.batch_size < OPTIONS.batch_size


def test_a_cpu_run_is_judged_by_its_tensors_against_the_ram():
    fits = judge(OPTIONS, device="cpu", total=2**40)
    assert (fits.fits, fits.limit) == (True, None)
    # the RAM its process's measured share and its run's other processes (memory.CPU_PROCESS)
    # leave falls short of its peak
    share = CPU_PROCESS.share(fits.peak)
    tight = judge(OPTIONS, device="cpu", total=fits.peak + share - MIB)
    assert (tight.fits, tight.limit) == (False, Limit.TENSORS)
    assert "does not fit" in tight.line("the RAM") and tight.largest.batch_size < 8


def test_what_fits_names_the_limit_at_the_next_size(edges):
    tensors, completes, _ = edges
    capacity = (tensors + completes) // 2  # batch 8 does not fit: its reserve decides
    fit = max_batch_size(OPTIONS, total=total_for(capacity), calibration=EXACT)
    assert fit.decided_by in (Limit.RESERVE, Limit.TENSORS) and fit.peak_beyond > fit.peak_at_fit
    words = ("the allocator's reserve decides" if fit.decided_by == Limit.RESERVE
             else "its tensors decide")
    assert f"; at {fit.batch_size + 1} {words}" in fit.line("the GPU")


def test_predict_says_a_batch_does_not_fit_and_the_largest_that_does(capsys, tmp_path):
    """`predict --batch-size 22` printed "130.3 GB … for tensors, 147.6 GB as nvidia-smi counts
    it" without a word that it does not fit the H200. (A small GPT-2 with GPT-2's vocabulary:
    its logits, 0.1 GB a sample at 512 tokens, decide.)"""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                                "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 50257,
                                "n_positions": 512}))
    common = ["predict", "--model", str(path), "--seq-len", "512", "--gpu-model", "NVIDIA H200"]
    assert main([*common, "--batch-size", "4096"]) == 0
    said = capsys.readouterr().out.splitlines()[-1]
    assert said.startswith("does not fit NVIDIA H200 (") and ": its tensors decide" in said
    largest = int(said.rsplit("; the largest batch size that fits: ", 1)[1])
    assert main([*common, "--batch-size", str(largest), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fit"]["fits"] is True


def test_the_reserve_predicted_is_what_the_device_lets_the_allocator_keep(edges):
    """Where the reserve with no device around it passes the capacity, the caching allocator,
    refused by cudaMalloc, releases its cached segments and asks again: its reserve, and NVML's
    figure, stay within the device (the uncapped figure said more than the device holds)."""
    tensors, completes, reserve = edges
    capacity = (completes + reserve) // 2
    free = predict(OPTIONS, calibration=EXACT)  # the calibrated device's 140 GiB: no bound
    held = predict(OPTIONS, calibration=EXACT, total=total_for(capacity))
    assert free.peak_reserved == reserve and free.peak == tensors
    # Released and split again, a block or two is taken whole by another request
    assert abs(held.peak - free.peak) < 2 * MIB
    assert tensors < held.peak_reserved <= capacity < reserve
    assert held.nvml_peak == EXACT.context_bytes + held.peak_reserved + EXACT.outside_bytes
    assert held.nvml_peak == judge(OPTIONS, total=total_for(capacity),
                                   calibration=EXACT).nvml_peak

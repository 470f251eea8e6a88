"""The trace at the capacity's edge held to what the H200's allocator did: ELECTRA-large bf16
at batch 265 (s512, AdamW), every action recorded on 2026-12-02
(docs/data/h200-2026-12-02/allocator-events.tgz), against the same run as "What fits" lays it
out (batch sizes 2 and 3 traced for an H200 on this CPU, made linear).

- Each step allocates what the run allocated, in requests of 1 MiB or more, within 0.05 % of
  its bytes (454.3 GB a step; what is left: the embedding's backward sorts its indices,
  data-dependent scratch, 186 MiB). The trace allocated 11 % more until 2026-12-02 (96 sums of
  530 MiB a step that autograd's engine makes in place).
- Replayed at the run's ceiling, the simulated allocator ends with the reserve the run ended
  with, to the byte (with new segments at rising addresses it ended 279 MiB short).

And at the runs the edge turned on (allocator-events-3.tgz, -5.tgz): ELECTRA-large at 266, which
ran out of memory in its third step after releasing its cache once in the second (the trace did
not until cuBLAS's forward workspaces were two blocks, 32 MiB and 1 MiB, not one of 33 MiB), and
Flan-T5-small bf16 s512 at 224, which ran, and 228, which ran out of memory asking for the fp32
copy of its logits (the trace made its log-probabilities fp32 too until CUDA's autocast of
cross entropy was followed)."""

from __future__ import annotations

import pytest

from anatomy.prediction import memory, replay
from bench.peak_snapshot import first_refusal
from bench.prediction_grid import Config
from tests.unit.test_caching_allocator import _recorded_runs

LABEL = "electra-large bf16 b265 s512 adamw_torch"
MIB = 2**20


def _recorded_steps(events: dict) -> list[int]:
    """Bytes each step's requests of 1 MiB or more asked for (a step begins as its batch is
    sent to the device: two tensors)."""
    steps: list[int] = []
    fetching = False
    for action, _, size, _, frame in events["events"]:
        if action != "alloc":
            continue
        sent = "send_to_device" in events["frames"][frame]
        if sent and not fetching:
            steps.append(0)
        fetching = sent
        if steps and size >= MIB:
            steps[-1] += size
    return steps


def _traced_steps(events: list[tuple]) -> list[int]:
    steps: list[int] = []
    for kind, _, value in events:
        if kind == replay.MARK and value == "batches":
            steps.append(0)
        elif kind == replay.ALLOC and steps and value >= MIB:
            steps[-1] += int(value)
    return steps


def _replayed(events: list[tuple], ceiling: int) -> replay.Measurement:
    """The trace through the simulated allocator at the run's ceiling, as "What fits" walks it."""
    return replay.measure(events, cuda=True, capacity=ceiling)


def test_electra_at_the_edge_is_laid_out_as_the_h200_ran_it(tmp_path):
    result, events = _recorded_runs(tmp_path)[LABEL]
    traced = _traced(LABEL)
    recorded = _recorded_steps(events)
    assert len(recorded) == len(_traced_steps(traced)) == 3
    for real, trace in zip(recorded, _traced_steps(traced)):
        assert abs(trace - real) < 0.0005 * real
    replayed = _replayed(traced, result["memory"]["ceiling"])
    assert not replayed.out_of_memory
    assert replayed.final_reserved == result["memory"]["reserved"]


def _traced(label: str) -> list[tuple]:
    """The run of `label` as "What fits" lays it out (batch sizes 2 and 3, made linear)."""
    config = Config.from_label(label)
    options = config.options()
    sizes = memory.BatchSizes(options, "cuda", memory.calibration_for("cuda", "NVIDIA H200"))
    recording = sizes._recording(config.batch_size)
    assert sizes.linear
    return list(replay.stream(recording, sizes.steps_at(config.batch_size), options.grad_accum))


@pytest.mark.parametrize("label, archive", [
    ("electra-large bf16 b266 s512 adamw_torch", "allocator-events-3.tgz"),
    ("flan-t5-small bf16 b224 s512 adamw_torch", "allocator-events-5.tgz"),
    ("flan-t5-small bf16 b228 s512 adamw_torch", "allocator-events-5.tgz"),
])
def test_at_the_edge_the_trace_ends_as_the_h200s_run_did(tmp_path, label, archive):
    """Replayed at the run's ceiling, the trace completes where the run completed, with its
    reserve to the byte, and runs out of memory where it did, at the request it refused, with
    its reserve then (to the byte for ELECTRA; one 2 MiB segment apart for Flan-T5 at 228)."""
    result, events = _recorded_runs(tmp_path, (archive,))[label]
    memory_ = result["memory"]
    traced = _traced(label)
    replayed = _replayed(traced, memory_["ceiling"])
    if result["status"] == "completed":
        assert not replayed.out_of_memory
        assert replayed.final_reserved == memory_["reserved"]
        return
    assert replayed.out_of_memory
    assert replayed.refused == first_refusal(events["events"])[1]
    assert abs(replayed.final_reserved - memory_["reserved"]) <= 2 * MIB

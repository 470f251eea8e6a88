"""The trace at the capacity's edge held to what the H200's allocator did: ELECTRA-large bf16
at batch 265 (s512, AdamW), every action recorded on 2026-12-02
(docs/data/h200-2026-12-02/allocator-events.tgz), against the same run as "What fits" lays it
out (batch sizes 2 and 3 traced for an H200 on this CPU, made linear).

- Each step allocates what the run allocated, in requests of 1 MiB or more, within 0.05 % of
  its bytes (454.3 GB a step; what is left: the embedding's backward sorts its indices,
  data-dependent scratch, 186 MiB). The trace allocated 11 % more until 2026-12-02 (96 sums of
  530 MiB a step that autograd's engine makes in place).
- Replayed at the run's ceiling, the simulated allocator ends with the reserve the run ended
  with, to the byte (with new segments at rising addresses it ended 279 MiB short)."""

from __future__ import annotations

from anatomy.analysis.prediction import memory, replay
from anatomy.analysis.prediction.allocator import CachingAllocator
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


def _end_reserve(events: list[tuple], ceiling: int) -> int:
    allocator, live = CachingAllocator(ceiling), {}
    for kind, tid, value in events:
        if kind == replay.ALLOC and value:
            live[tid] = allocator.malloc(value)
        elif kind == replay.FREE and tid in live:
            allocator.free(live.pop(tid))
        elif kind == replay.MARK and value == replay.EMPTY_CACHE:
            allocator.empty_cache()
    return allocator.stats.reserved


def test_electra_at_the_edge_is_laid_out_as_the_h200_ran_it(tmp_path):
    result, events = _recorded_runs(tmp_path)[LABEL]
    config = Config.from_label(LABEL)
    options = config.options()
    sizes = memory.BatchSizes(options, "cuda", memory.calibration_for("cuda", "NVIDIA H200"))
    traced = list(replay.stream(sizes._recording(config.batch_size), sizes.steps,
                                options.grad_accum))
    assert sizes.linear
    recorded = _recorded_steps(events)
    assert len(recorded) == len(_traced_steps(traced)) == 3
    for real, trace in zip(recorded, _traced_steps(traced)):
        assert abs(trace - real) < 0.0005 * real
    assert _end_reserve(traced, result["memory"]["ceiling"]) == result["memory"]["reserved"]

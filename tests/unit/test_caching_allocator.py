"""The simulated caching allocator (anatomy/prediction/allocator.py) held to what the
H200's allocator did: every action of nineteen runs at the capacity's edge, recorded on 2026-12-02
(docs/data/h200-2026-12-02/allocator-events*.tgz), replayed at each run's ceiling."""

from __future__ import annotations

import gzip
import json
import tarfile
from pathlib import Path

from anatomy.prediction.allocator import CachingAllocator
from bench.peak_snapshot import first_refusal, replay_recorded

DATA = Path(__file__).resolve().parents[2] / "docs" / "data" / "h200-2026-12-02"
MIB = 2**20


def test_a_new_segment_lies_below_the_others_and_its_block_is_taken_first():
    """cudaMalloc gave the H200's runs each new segment below the ones before: among free
    blocks of one size, the lowest address is the newest segment's."""
    allocator = CachingAllocator()
    older, newer = allocator.malloc(30 * MIB), allocator.malloc(30 * MIB)
    assert newer.addr < older.addr
    allocator.free(older)
    allocator.free(newer)
    assert allocator.malloc(20 * MIB).segment == newer.segment


def _recorded_runs(tmp_path: Path, archives: tuple[str, ...] = (
        "allocator-events.tgz", "allocator-events-2.tgz")) -> dict[str, tuple[dict, dict]]:
    runs = {}
    for name in archives:
        with tarfile.open(DATA / name) as archive:
            archive.extractall(tmp_path, filter="data")
    for path in tmp_path.rglob("*.result.json"):
        result = json.loads(path.read_text())
        events = path.with_name(path.name.replace(".result.json", ".events.json.gz"))
        with gzip.open(events, "rt") as file:
            runs[result["label"]] = (result, json.load(file))
    return runs


def test_the_h200s_recorded_actions_end_as_the_runs_did(tmp_path):
    """Fed every action a run's allocator took, the simulated one runs out of memory at the
    request the run refused, or completes, and reserves what the run reserved, to the byte —
    but for RegNet-Y-040, whose cuDNN asked for workspaces the GPU refused (each refusal
    released the cache: actions the history does not hold), and which still runs out of memory
    at the same 580,586,496 B request. Thirty-eight runs: ELECTRA-large, DeiT-base, Flan-T5-small,
    RegNet-Y-040, EfficientNet-B0 and Llama-2-7B LoRA at their edges, and the six configurations
    of the out-of-sample check (edge-out-of-sample.md) at theirs, seventeen of them out of
    memory."""
    runs = _recorded_runs(tmp_path, tuple(sorted(p.name for p in DATA.glob(
        "allocator-events*.tgz"))))
    assert len(runs) == 38
    assert sum(result["status"] == "oom" for result, _ in runs.values()) == 17
    for label, (result, events) in runs.items():
        simulated = replay_recorded(events["events"], result["memory"]["ceiling"])
        refused = first_refusal(events["events"])
        assert simulated["status"] == result["status"], label
        if refused:
            assert (simulated["at"], simulated["size"]) == refused, label
        if label != "regnet-y-040 fp32 b1349 sgd":
            assert simulated["reserved"] == result["memory"]["reserved"], label


def test_a_refused_workspace_releases_the_cache_and_its_convolution_runs_without_one():
    """cuDNN's convolutions (Conv_v8.cpp, heuristics mode) ask the caching allocator for their
    engine's workspace; a refusal (after the allocator released its free segments and retried)
    is caught and the next engine runs, and is kept for that convolution: the H200 refused
    RegNet-Y-040's 547 MiB workspace at batch 1,340 five times, then ran on, and ran out of
    memory only at the next activation. The replay takes a refused workspace (replay.Workspace)
    as the engine with none, from then on for its key; any other refusal ends the run."""
    from anatomy.prediction.replay import ALLOC, FREE, Workspace, measure

    key = ("forward", (1088, 7, 7))
    events = [(ALLOC, 1, 60 * MIB), (ALLOC, 2, 30 * MIB), (FREE, 2, 0),  # 30 MiB cached, free
              (ALLOC, 3, Workspace(50 * MIB, key)), (FREE, 3, 0),  # refused: cache released
              (ALLOC, 4, 30 * MIB),  # fits where the cached segment was
              (ALLOC, 5, Workspace(10 * MIB, key)), (FREE, 5, 0)]  # the same engine: none
    run = measure(events, cuda=True, capacity=100 * MIB)
    assert not run.out_of_memory
    assert run.final_reserved == 90 * MIB
    assert run.largest_request == 0  # no mark of training here: requests are not counted
    refused = measure(events[:3] + [(ALLOC, 6, 50 * MIB)], cuda=True, capacity=100 * MIB)
    assert refused.out_of_memory and refused.refused == 50 * MIB

"""Several training processes (issue 12) without starting one: the options, the store's rank
columns on old files, each rank's prediction, FSDP's units, the steady rate over the
ranks, a stored run of two GPUs read back, and several GPUs taken all or none. (FSDP's shards traced:
tests/e2e/test_prediction_traced.py; real ranks on this CPU: tests/e2e/test_several_processes.py.)"""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from anatomy.analysis.options import RunOptions, validate
from anatomy.analysis.report import report
from anatomy.cli import main
from anatomy.store import PhaseMark, Step, Store

RANK_PHASES = ["kernel", "weights", "training"]


@pytest.mark.parametrize("values, gpus, field, words", [
    ({"gpus": "0,0"}, 2, "gpus", "named twice"),
    ({"gpus": "0,2"}, 2, "gpus", "out of range: 0 to 1"),
    ({"gpus": "0,x"}, 2, "gpus", "not a GPU index"),
    ({"gpus": "0,1"}, 0, "gpus", "no GPU"),
    ({"processes": 2}, 1, "processes", "--gpus 0,1"),
    ({"gpus": "0,1", "processes": 3}, 2, "processes", "does not match"),
    ({"strategy": "fsdp"}, 1, "strategy", "several processes"),
    ({"strategy": "fsdp", "processes": 2}, 0, "strategy", "needs GPUs"),
    ({"strategy": "fsdp"}, 0, "strategy", "needs GPUs"),  # not "give --gpus 0,1" without one
    ({"processes": 2, "profile_steps": 2}, 0, "profile_steps", "single process"),
    ({"strategy": "zero"}, 2, "strategy", "not one of ddp, fsdp"),
])
def test_several_processes_are_validated_in_one_line(values, gpus, field, words):
    errors = validate(values, gpus, resolve_model=False)
    assert words in errors[field] and "\n" not in errors[field]


def test_world_size_and_gpus_of_the_options():
    assert RunOptions().world_size == 1 and not RunOptions().distributed
    assert RunOptions(gpu=1).gpu_list() == (1,)
    options = RunOptions(gpus="1, 0", strategy="fsdp")
    assert options.gpu_list() == (1, 0) and options.world_size == 2 and options.distributed
    assert RunOptions(processes=3).world_size == 3
    assert validate(RunOptions(gpus="0,1", strategy="fsdp"), 2, resolve_model=False) == {}


def test_a_store_written_before_ranks_gains_them(tmp_path):
    path = tmp_path / "old.sqlite"
    Store(path)
    with sqlite3.connect(path) as db:  # as a store of before ranks looked
        db.execute("DROP INDEX steps_rank")  # by rank and time: no rank, no such index
        for table in ("phases", "steps"):
            db.execute(f"ALTER TABLE {table} DROP COLUMN rank")
        db.execute("DROP TABLE alembic_version")  # nor kept schema revisions
    old = Store(path, read_only=True)  # read as it is: every row is rank 0's
    assert old.phases(1) == [] and old.steps(1, None) == [] and old.ranks(1) == [0]
    run_id = Store(path).create_run({"model": "tiny"}, "cpu-rss", "rss", 0, {})  # migrates
    fresh = Store(path)
    fresh.write(run_id, phases=[PhaseMark("start", "kernel", 1.0, rank=1),
                                PhaseMark("end", "kernel", 2.0, rank=1),
                                PhaseMark("start", "kernel", 1.5)],
                steps=[Step(3.0, 1, 2, 0.5, None, None, rank=1)])
    assert [(p.rank, p.end_s) for p in fresh.phases(run_id, None)] == [(1, 2.0), (0, None)]
    assert fresh.steps(run_id) == [] and fresh.steps(run_id, 1)[0].rank == 1
    assert fresh.ranks(run_id) == [0, 1]


# --- each rank's predicted memory: the arithmetic ---

def _alone(peak_at: str = "backward pass"):
    from anatomy.prediction import Prediction

    return Prediction(parameters=1000, trainable_parameters=1000, weights=4000, gradients=4000,
                      optimizer_states=8000, activations=3000, peak=20000, peak_at=peak_at,
                      device="cuda", moments={})


def test_a_ddp_rank_is_the_single_process_plus_one_copy_of_the_gradients():
    from anatomy.prediction import rank_prediction

    rank = rank_prediction(_alone(), "ddp", 2)
    assert rank.buffers == {"ddp_buckets": 4000} and rank.peak == 20000 + 4000
    assert (rank.weights, rank.gradients, rank.optimizer_states) == (4000, 4000, 8000)
    assert rank.nvml_peak is None  # NCCL's own memory not calibrated: no NVML figure
    assert "not calibrated" in rank.line()


def test_a_rank_reads_as_one_process_prediction_of_its_own_figures():
    """The Anatomy page reads a rank's measured components against `as_prediction()`."""
    from dataclasses import replace

    from anatomy.prediction import rank_prediction

    alone = replace(_alone(), moments={"forward pass": 15000, "backward pass": 20000},
                    peak_reserved=21000, context=500, outside=200)
    rank = rank_prediction(alone, "ddp", 2, nccl=900)
    one = rank.as_prediction()
    assert (one.weights, one.gradients, one.optimizer_states) == (4000, 4000, 8000)
    assert one.peak == 24000 and max(one.moments.values()) == one.peak  # buckets all along
    assert one.nvml_peak == rank.nvml_peak == 500 + 21000 + 4000 + 200 + 900
    assert one.temporary == alone.temporary + 4000  # the buckets: beyond the components
    uncalibrated = rank_prediction(alone, "ddp", 2).as_prediction()
    assert uncalibrated.nvml_peak is None  # never an NVML figure without NCCL's memory


def test_predict_shows_each_rank_with_several_processes(capsys):
    assert main(["predict", "--model", "tiny", "--processes", "2", "--seq-len", "32",
                 "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    ranks = out["ranks"]
    assert ranks["strategy"] == "ddp" and ranks["world_size"] == 2
    assert ranks["components"]["ddp_buckets"] == out["components"]["gradients"]


def test_the_steady_rate_leaves_out_the_first_steps_and_counts_every_rank(store):
    from anatomy.analysis.components import MEASURED_STEPS
    from anatomy.analysis.report import steady_rate

    # Step 1 ends after 3 s of one-time costs; steps 2-6 take 0.1 s each.
    steps = [Step(3.0 + 0.1 * (n - 1), n, 6, None, None, None) for n in range(1, 7)]
    run, short = (store.create_run({"model": "tiny"}, "nvml", "v2", 0, {}) for _ in range(2))
    store.write(run, steps=steps)
    store.write(short, steps=steps[:3])
    span, short_span = (store.step_span(r, MEASURED_STEPS) for r in (run, short))
    # From the end of step 3 (after the probe's steps) to the end of step 6: 3 steps, 8 samples
    # each across the two ranks, in 0.3 s.
    assert steady_rate(span, 4, 1, 2) == pytest.approx(3 * 4 * 2 / 0.3)
    assert steady_rate(span, 4, 2, 1) == pytest.approx(3 * 8 / 0.3)
    assert steady_rate(short_span, 4, 1, 2) is None  # nothing after the first steps
    assert steady_rate(span, None, None, 2) is None  # a batch nobody said


def test_fsdp_units_are_the_layers_never_what_holds_the_input_embeddings():
    from anatomy.analysis import models
    from anatomy.strategies.fsdp import unit_classes

    bert, _ = models.build_model("tiny", "cpu")
    assert "BertEmbeddings" in bert._no_split_modules  # transformers lists it; accelerate
    assert unit_classes(bert) == ["BertLayer"]  # would shard its embeddings twice
    llama, _ = models.build_model("tiny-llama", "cpu")
    assert unit_classes(llama) == ["LlamaDecoderLayer"]


def test_scaling_efficiency_is_computed_in_one_place():
    from anatomy.analysis.compare import scaling_efficiency

    assert scaling_efficiency(180.0, 100.0, 2) == pytest.approx(0.9)
    assert scaling_efficiency(None, 100.0, 2) is None and scaling_efficiency(90.0, None, 2) is None


# --- a user's own launch of several processes: every rank joins `anatomy watch`'s run ---


# --- a stored run of two GPUs, read back: report, figure, Compare, Anatomy ---

def _two_gpu_run(store: Store, world: int, rate: float) -> int:
    from anatomy.store import Sample

    options = RunOptions(model="tiny", batch_size=4, **({"gpus": "0,1"} if world > 1 else {}))
    env = {"gpu_name": "NVIDIA H200", **({"world_size": 2, "strategy": "ddp", "gpus": [0, 1]}
                                         if world > 1 else {})}
    run_id = store.create_run(options.to_dict(), "nvml", "v2", 0, env)
    marks, samples = [], []
    for rank in range(world):
        for i, name in enumerate(["kernel", "weights", "training"]):
            marks += [PhaseMark("start", name, 1.0 + i, rank), PhaseMark("end", name, 1.9 + i, rank)]
        samples += [Sample(1.5 + i, rank, (1000 + 100 * i + 10 * rank) * 2**20, None, None, None)
                    for i in range(3)]
    store.write(run_id, samples=samples, phases=marks)
    store.update_run(run_id, summary={"samples_per_second": rate, "time_s": 1.0, "steps": 1},
                     status="completed")
    return run_id


def test_a_two_gpu_run_reads_back_per_gpu(store):
    from anatomy.analysis.report import run_rows
    from anatomy.views.compare import run_labels, side_by_side
    from anatomy.views.figures.live import memory_figure

    one, two = _two_gpu_run(store, 1, 100.0), _two_gpu_run(store, 2, 190.0)
    rep = report(store, two)
    assert rep.world_size == 2 and rep.gpus == (0, 1)
    assert [r.label() for r in rep.ranks] == ["GPU 0 (rank 0)", "GPU 1 (rank 1)"]
    assert rep.gpu_peaks() == {0: 1200 * 2**20, 1: 1210 * 2**20}
    names = [t.name for t in memory_figure(rep, store.samples(two)).data]
    assert "GPU 0 (rank 0)" in names and "GPU 1 (rank 1)" in names
    assert "end of phase, GPU 1 (rank 1)" in names
    rows = {r["what"]: r for r in side_by_side([report(store, one), rep])}
    assert rows["scaling efficiency"][f"Run {two}"] == "95%"
    assert rows["samples/s after the first steps"][f"Run {two}"] == "—"  # no steps stored
    assert rows["peak per GPU (MiB)"][f"Run {two}"] == "GPU 0: 1,200 · GPU 1: 1,210"
    # One process has no strategy (its stored default "ddp" would read as one in every label):
    # the strategy is no difference, the GPUs are.
    assert rows["Strategy"][f"Run {one}"] == "—" and rows["Strategy"][f"Run {two}"] == "ddp"
    assert (rows["Strategy"][""], rows["GPUs"][""]) == ("", "≠")
    labels = run_labels([report(store, one), rep])
    assert labels[one] == f"Run {one} · 1 GPU" and labels[two] == f"Run {two} · GPUs 0,1"
    assert "world_size" not in report(store, one).to_dict()  # one process prints as before
    devices = {row.id: row.device for row in run_rows(store)}  # the Runs page's device column
    assert devices == {one: "NVIDIA H200", two: "2 × NVIDIA H200 (ddp)"}


def test_several_gpus_are_taken_all_or_none(store, fresh_nvml, monkeypatch, tmp_path):
    """A run on GPUs 0 and 1 is refused, with nothing recorded and no lock kept, when GPU 1 is
    busy (fake NVML: two GPUs)."""
    from anatomy.engine import nvml
    from anatomy.engine.manager import LOCK_DIR_ENV, DeviceBusy, DeviceLock, RunManager
    from tests.fake_nvml import FakePynvml

    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml._lib = FakePynvml(gpus=2)
    busy = DeviceLock("gpu1")
    assert busy.acquire("another run")
    with pytest.raises(DeviceBusy, match="GPU 1 is busy: another run"):
        RunManager(store).start(RunOptions(model="tiny", gpus="0,1"))
    assert store.runs() == []
    assert DeviceLock("gpu0").acquire("free")  # GPU 0's lock was given back


def test_predict_for_cpu_processes_ends_on_each_ones_need_not_a_single_processs(capsys):
    """`predict --processes 2` said "each of the 2 ranks should need about 113 MB" and then "this
    run should need about 97 MB" (one process's): it ends on each process's need, and a CPU's
    processes talk over gloo, not NCCL."""
    from anatomy import cli

    assert cli.main(["predict", "--model", "tiny", "--processes", "2", "--device", "cpu",
                     "--seq-len", "32"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert lines[1].startswith("each of the 2 processes (ddp) should need about")
    assert lines[-1].startswith("each of the 2 processes (ddp) should need about")
    assert "this run should need" not in out and "NCCL" not in out
    # The component table is one process's (its peak is not a rank's): its heading says so.
    assert any(line.startswith("one process alone") for line in lines)


def test_two_cpu_processes_are_said_as_processes_in_titles_lists_and_compare(store, seed):
    """The Live title never said 2 processes; Compare called the one RSS of both processes
    "peak per GPU"."""
    from anatomy.analysis.report import run_rows
    from anatomy.store import Sample
    from anatomy.views import anatomy as anatomy_view
    from anatomy.views import compare
    from anatomy.views import gpus as gpus_view
    from anatomy.views.figures import live as live_figure

    one = seed(backend="cpu-rss")
    two = seed(backend="cpu-rss")
    store.update_run(two, options={**store.run(two).options, "processes": 2})
    store.merge_environment(two, {"world_size": 2, "strategy": "ddp"})
    store.write(two, phases=[PhaseMark("start", "training", 6.0, rank=1),
                             PhaseMark("end", "training", 9.0, rank=1)])
    # The sampler's RSS of each rank's own processes (rank_series), beside the whole tree's,
    # with the host's RAM as its total.
    store.write(two, samples=[Sample(t, series, mb * 2**20, None, 24 * 2**30, None)
                              for t in (7.0, 8.0) for series, mb in ((1, 600), (2, 500))])
    rep = report(store, two)
    assert " on 2 × CPU (ddp)" in rep.title()
    assert {r.id: r.device for r in run_rows(store)}[two] == "2 × CPU (ddp)"
    assert [(r.measured_alone, r.peak_mb) for r in rep.ranks] == [(True, 600), (True, 500)]
    rows = {row["what"]: row for row in compare.side_by_side([report(store, one), rep])}
    assert "peak per GPU (MiB)" not in rows  # one RSS of both was called so
    assert rows["peak per process (MiB)"][f"Run {two}"] == "rank 0: 600 · rank 1: 500"
    assert rows["processes"][f"Run {two}"] == "2"
    # No GPU index or GPUs for a CPU run beside one that stored none (labelled "GPU 0 · 1 GPU").
    store.update_run(one, options={k: v for k, v in store.run(one).options.items()
                                   if k not in ("gpu", "gpus")})
    pair = [report(store, one), rep]
    assert compare.run_labels(pair)[two] == f"Run {two} · 2 processes"
    assert compare.run_labels(pair)[one] == f"Run {one} · 1 process"  # was "1 processes"
    rows = {row["what"]: row for row in compare.side_by_side(pair)}
    assert (rows["GPU index"][f"Run {two}"], rows["GPU index"][""]) == ("—", "")
    # The Live chart: a line for the tree, one for each rank's own processes, each named.
    names = [t.name for t in live_figure.memory_figure(rep, store.samples(two)).data]
    assert names[:3] == ["CPU RSS of the training processes, together",
                         "rank 0: its processes' RSS", "rank 1: its processes' RSS"]
    # The Per process view's heat strip: a row per rank, its RSS in MiB (a fraction of the
    # host's RAM made every rank one colour).
    from anatomy.views.figures import gpus as gpu_figures
    strip = gpu_figures.heat_strip(rep, store.samples(two)).data[0]
    assert list(strip.y) == ["rank 0", "rank 1"] and strip.zmax is None
    assert np.nanmax(strip.z[0]) == 600 and np.nanmax(strip.z[1]) == 500
    # Two rows leave the colour bar room for its numbers (28 px of it, they overlapped).
    assert gpu_figures.heat_strip(rep, store.samples(two)).layout.height >= 200
    # The Per process view: the spread of the two processes' own peaks, not of "hosts".
    assert gpus_view.spread_line(rep).startswith("2 processes (each one's own RSS): peak 500 MiB")
    rows = anatomy_view.rank_rows(rep, None)
    assert {r.component for r in rows} >= {"peak (tensors)"}  # the CPU has no allocator
    assert "allocator's peak" not in {r.component for r in rows}
    ranks = [r for r in rows if r.component.startswith("peak RSS")]
    assert [(r.gpu, r.component, r.measured) for r in ranks] == [
        ("rank 0", "peak RSS (its own processes)", "600 MiB"),
        ("rank 1", "peak RSS (its own processes)", "500 MiB")]


def test_a_users_launch_that_said_no_strategy_is_given_none(store, seed, capsys):
    """`anatomy watch -- torchrun …` of a user's ranks: `show` printed "2 processes (None)" and
    the Runs list "2 × CPU (ddp)", a strategy the run never reported."""
    from anatomy import cli
    from anatomy.views import live

    run_id = seed(backend="cpu-rss")
    store.merge_environment(run_id, {"world_size": 2})
    store.write(run_id, phases=[PhaseMark("start", "training", 6.0, rank=1),
                                PhaseMark("end", "training", 9.0, rank=1)])
    rep = report(store, run_id)
    assert (rep.strategy, rep.processes, rep.devices) == (None, "2 processes", "2 × CPU")
    assert cli.main(["show", str(run_id), "--store", str(store.path)]) == 0
    out = capsys.readouterr().out
    assert "2 processes; each rank's memory" in out and "None" not in out
    assert "2 processes" in live.summary_lines(rep)  # the Live page's summary said "…, None"


def test_ranks_that_recorded_nothing_are_named_with_why(store, seed, capsys):
    """`torchrun --nproc-per-node 2 train.py` with the callback, without `anatomy watch`: rank 0
    alone records, and `show` said "2 processes; each rank's memory at its phases' ends" over
    rank 0's row alone, as though the table were whole."""
    from anatomy import cli
    from anatomy.views import text

    run_id = seed(backend="cpu-rss")
    store.merge_environment(run_id, {"world_size": 2})
    store.update_run(run_id, source={"kind": "script", "script": "/home/me/train.py"})
    rep = report(store, run_id)
    assert [r.rank for r in rep.ranks] == [0]
    said = ("rank 1 recorded nothing: a launch's ranks record with rank 0 alone unless "
            "`anatomy watch -- torchrun …` follows the launch")
    assert text.unrecorded_ranks(rep) == said
    assert cli.main(["show", str(run_id), "--store", str(store.path)]) == 0
    assert said in capsys.readouterr().out
    store.write(run_id, phases=[PhaseMark("start", "training", 6.0, rank=1)])
    assert text.unrecorded_ranks(report(store, run_id)) is None  # every rank recorded


def test_a_rank_killed_otherwise_is_the_cause_before_one_the_launcher_ended_with_sigterm():
    """Each rank's end is timed by a thread when it next holds the GIL: on a loaded machine the
    launcher's SIGTERM to the other rank can be timed first (seen: "rank 0 was killed by SIGTERM"
    for a `kill -9` of rank 1). Two SIGTERMs (one the user's) are told apart by their times."""
    import signal

    from anatomy.engine.ranks import RankEnd, _Deaths

    deaths = _Deaths(2)
    try:
        deaths.ended.update({0: RankEnd(1.0, -signal.SIGTERM, False),
                             1: RankEnd(1.2, -signal.SIGKILL, False)})
        assert deaths.first_cause()[0] == 1
        deaths.ended[1] = RankEnd(1.2, -signal.SIGTERM, False)
        assert deaths.first_cause()[0] == 0
    finally:
        deaths.done.set()

"""A run's live figures as the collector feeds them (engine/figures.py): what the Trainer's logs,
`run.metrics()` and the /metrics endpoint read."""

from __future__ import annotations

from anatomy.analysis.trackers import component_name, peak_name, phase_name
from anatomy.engine import protocol
from anatomy.engine.collector import Collector
from anatomy.engine.figures import Figures
from anatomy.store import Components, PhaseMark, Sample, Step
from anatomy.units import MIB
from anatomy.vocabulary import Backend


def _samples(*pairs: tuple[float, int], gpu: int = 0) -> protocol.Samples:
    return protocol.Samples([Sample(t, gpu, used * MIB, None, None, None) for t, used in pairs])


def _mark(edge: str, name: str, t: float, rank: int = 0) -> protocol.Phase:
    return protocol.Phase(PhaseMark(edge, name, t), protocol.Source(rank=rank))


def test_a_phases_memory_is_its_last_sample_at_its_end_whichever_queue_came_first():
    figures = Figures([0], Backend.NVML, t0=0.0)
    reader = figures.reader()
    figures.see(_mark("start", "weights", 1.0))
    figures.see(_samples((1.0, 100), (1.5, 300)))
    figures.see(_mark("end", "weights", 1.6))  # no sample past its end yet: not known
    assert phase_name("weights") not in reader.take()
    figures.see(_samples((1.7, 900)))  # the next phase's: the weights' is still 300
    assert reader.take()[phase_name("weights")] == 300
    # its samples after the mark: the same answer
    figures.see(_samples((2.0, 400), (3.0, 500), (3.5, 700)))
    figures.see(_mark("end", "training", 3.2))
    assert reader.take() == {phase_name("training"): 500, peak_name("gpu0"): 700}


def test_each_reader_gets_the_peak_since_it_last_read_and_the_phases_once():
    figures = Figures([0, 1], Backend.NVML, t0=0.0)
    logs, own = figures.reader(), figures.reader()
    figures.see(_samples((1.0, 10), (1.1, 50), (1.2, 20)))
    figures.see(_samples((1.0, 5), gpu=1))
    assert logs.take() == {peak_name("gpu0"): 50, peak_name("gpu1"): 5}
    figures.see(_samples((2.0, 30)))
    assert logs.take() == {peak_name("gpu0"): 30}  # since its last read
    assert own.take() == {peak_name("gpu0"): 50, peak_name("gpu1"): 5}  # unaffected
    assert logs.take() == {}


def test_a_cpu_runs_peak_is_named_cpu_and_components_come_once_in_mib():
    figures = Figures([], Backend.CPU_RSS, t0=0.0)
    reader = figures.reader()
    figures.see(_samples((1.0, 64)))
    figures.see(protocol.ComponentsMeasured(Components.of(weights=16 * MIB, gradients=16 * MIB),
                                            protocol.Source()))
    figures.predicted_peak = 80 * MIB
    taken = reader.take()
    assert taken == {"anatomy/peak_mib/cpu": 64, component_name("weights"): 16,
                     component_name("gradients"): 16, "anatomy/predicted_peak_mib": 80}
    assert component_name("weights") not in reader.take()
    assert all(name.startswith("anatomy/") for name in taken)


def test_the_collector_feeds_the_figures_and_counts_what_it_stored(store):
    run_id = store.create_run({}, Backend.CPU_RSS, None, 0, {}, preset="python")
    figures = Figures([0], Backend.CPU_RSS, t0=0.0)
    collector = Collector(store, run_id, figures=figures)
    collector.handle(_mark("start", "training", 0.5))
    collector.handle(_samples((1.0, 10), (1.1, 20)))
    collector.handle(protocol.StepReport(Step(1.2, 3, 10, 0.5, None, None), protocol.Source()))
    assert figures.stored == 0  # not written yet
    collector.flush()
    assert figures.stored == 2 == len(store.samples(run_id))
    (device,) = figures.devices_now()
    assert (device.label, device.used, device.rank, device.phase) == ("cpu", 20 * MIB, 0,
                                                                      "training")
    assert figures.steps() == {0: 3}


def test_the_readme_lists_the_names_a_tracker_gets():
    from anatomy.analysis.trackers import PREDICTED_PEAK
    from tests.conftest import PROJECT

    readme = (PROJECT / "README.md").read_text()
    for name in (phase_name("<phase>"), peak_name("gpu<N>"), peak_name("cpu"),
                 component_name("<part>"), PREDICTED_PEAK):
        assert f"`{name}`" in readme, name


def test_a_figure_that_fails_stops_the_figures_never_the_recording(store, monkeypatch):
    run_id = store.create_run({}, Backend.CPU_RSS, None, 0, {}, preset="python")
    figures = Figures([0], Backend.CPU_RSS, t0=0.0)

    def broken(samples):
        raise TypeError("a reading it does not know")

    monkeypatch.setattr(figures, "_sampled", broken)
    collector = Collector(store, run_id, figures=figures)
    collector.handle(_samples((1.0, 10)))
    collector.handle(_samples((1.1, 20)))
    collector.flush()
    assert figures.failed == "TypeError: a reading it does not know"
    assert len(store.samples(run_id)) == 2


def test_a_readers_first_take_has_each_devices_peak_since_the_run_began():
    figures = Figures([0], Backend.NVML, t0=0.0)
    figures.see(_samples((1.0, 70), (1.1, 40)))
    late = figures.reader()
    figures.see(_samples((2.0, 50)))
    assert late.take() == {peak_name("gpu0"): 70}
    assert late.take() == {}


def test_a_watched_processes_readers_each_take_from_a_reader_of_their_own_at_the_watch():
    """Under `anatomy watch` the callback's logs and run.metrics() ask the watch (a number per
    reader): each takes what a reader of the run takes, the other's take left to it."""
    from anatomy.engine.figures import Answers

    figures = Figures([0], Backend.CPU_RSS, t0=0.0)
    answers = Answers(figures)
    figures.see(_samples((1.0, 64)))
    logs = answers.answer(protocol.FiguresAsked(1, asked=7))
    assert logs == protocol.FiguresTaken(7, {peak_name("cpu"): 64})
    assert answers.answer(protocol.FiguresAsked(1, asked=8)).figures == {}
    assert answers.answer(protocol.FiguresAsked(2, asked=9)).figures == {peak_name("cpu"): 64}


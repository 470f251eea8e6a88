"""A strategy is one module: a dummy one, written here as ddp.py and fsdp.py are written and
registered as they are, is offered by the CLI (`--strategy`'s choices and help), the form, the
options' checks and the prediction; its Trainer's arguments, its stored name and its words on
the Anatomy page follow, with nothing else of anatomy told about it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from anatomy import strategies
from anatomy.analysis import options as run_options
from anatomy.analysis.options import RunOptions, validate
from anatomy.cli import main
from anatomy.store import PhaseMark, RunFacts
from anatomy.store.checks import InvalidValue
from anatomy.strategies import RankMemory, Strategy
from anatomy.units import mib_text
from tests.apptest import APP

NAME = "shared-states"
GATHER = "shared_states_gather"


class SharedStates(Strategy):
    """Each process keeps its share of the optimizer states (a first stage of ZeRO, say), and
    gathers its peers' shares into a buffer of its own share's size."""

    name = NAME
    label = "Shared states"
    summary = "each keeps its share of the optimizer states; processes in pairs"
    communication = "the states' gather buffer"
    buffers = (GATHER,)

    def problems(self, world: int, gpu_count: int, here: bool) -> str | None:
        if world % 2:
            return f"strategy: {NAME} shares the states in pairs: give an even number of processes"
        return None

    def training_arguments(self, model: Any = None) -> dict[str, Any]:
        return {"ddp_bucket_cap_mb": 50}

    def rank_memory(self, alone: Any, world: int) -> RankMemory:
        share = alone.optimizer_states // world
        return RankMemory(alone.weights, alone.gradients, share, alone.activations,
                          {GATHER: share}, alone.peak - alone.optimizer_states + 2 * share)


@pytest.fixture
def shared_states(monkeypatch):
    """The dummy registered as a module's entry in REGISTERED registers ddp and fsdp, for this
    test only. The options' table reads the registry as it loads: read again, as a process that
    loaded the dummy's module first would have it."""
    monkeypatch.setattr(strategies, "REGISTERED", list(strategies.REGISTERED))
    strategies.register(SharedStates())
    monkeypatch.setitem(run_options.FIELDS, "strategy", run_options.strategy_field())


def _help(command: str, capsys) -> str:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return " ".join(capsys.readouterr().out.split())  # argparse's wrapping undone


def test_the_cli_offers_a_registered_strategy_with_its_words(shared_states, capsys):
    for command in ("run", "predict", "sweep"):
        text = _help(command, capsys)
        assert "--strategy {ddp,fsdp,shared-states}" in text, command
        assert ("ddp (each holds the whole model), fsdp (parameters, gradients, optimizer states "
                "sharded; GPUs only) or shared-states (each keeps its share of the optimizer "
                "states; processes in pairs) (default ddp)") in text, command


def test_its_checks_are_the_options_checks(shared_states):
    assert validate(RunOptions(processes=2, strategy=NAME), 0, resolve_model=False) == {}
    refused = validate(RunOptions(processes=3, strategy=NAME), 0, resolve_model=False)
    assert refused == {"strategy": "strategy: shared-states shares the states in pairs: give an "
                                   "even number of processes"}
    # The declaration judges a strategy against the registry as it is when options are read.
    unknown = validate({"processes": 2, "strategy": "zero"}, 0, resolve_model=False)
    assert unknown["strategy"] == "strategy: 'zero' is not one of ddp, fsdp, shared-states"


def test_a_strategy_not_registered_is_refused_by_the_options_and_the_store():
    assert validate({"processes": 2, "strategy": NAME}, 0, resolve_model=False) == {
        "strategy": "strategy: 'shared-states' is not one of ddp, fsdp"}
    with pytest.raises(InvalidValue, match="'shared-states' is not one of ddp, fsdp"):
        RunFacts.of(world_size=2, strategy=NAME)


def test_the_form_offers_it_and_predicts_each_rank_with_it(shared_states):
    app = AppTest.from_file(APP, default_timeout=60).run()  # the unit tier: a machine of no GPU
    field = app.selectbox(key="option_strategy")
    assert list(field.options) == ["ddp", "fsdp", NAME]
    assert "shared-states (each keeps its share" in field.help
    field.set_value(NAME)
    app.number_input(key="option_processes").set_value(3)
    app.number_input(key="option_seq_len").set_value(32)
    app.button(key="predict").click().run()
    assert not app.exception
    assert [e.value for e in app.error] == [  # under Strategy: its name goes
        "shared-states shares the states in pairs: give an even number of processes",
        "Fix the fields marked above."]
    app.number_input(key="option_processes").set_value(2)
    app.button(key="predict").click().run()
    assert not app.exception and not app.error
    said = " ".join(info.value for info in app.info)
    assert "Each of the 2 processes (shared-states) should need about" in said


def test_the_prediction_works_out_a_rank_by_its_strategy(shared_states, capsys):
    flags = ["predict", "--model", "tiny", "--processes", "2", "--seq-len", "32", "--json"]
    assert main([*flags, "--strategy", NAME]) == 0
    out = json.loads(capsys.readouterr().out)
    ranks, alone = out["ranks"], out["components"]
    assert (ranks["strategy"], ranks["world_size"]) == (NAME, 2)
    states = alone["optimizer_states"]
    assert ranks["components"]["optimizer_states"] == states // 2
    assert ranks["components"][GATHER] == states // 2
    assert ranks["components"]["peak"] == alone["peak"]  # half the states kept, half gathered
    # Every strategy's buffers keep their keys (0: another strategy's), as before.
    assert ranks["components"]["ddp_buckets"] == ranks["components"]["fsdp_all_gather"] == 0
    assert main([*flags[:-1], "--processes", "3", "--strategy", NAME]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: strategy: shared-states shares the states in pairs: give an even number of "
        "processes")


def test_the_trainer_is_given_its_arguments(shared_states, tmp_path):
    from anatomy.engine.training import training_arguments

    ranks = training_arguments(RunOptions(processes=2, strategy=NAME), str(tmp_path), False)
    alone = training_arguments(RunOptions(strategy=NAME), str(tmp_path), False)
    assert (ranks.ddp_bucket_cap_mb, alone.ddp_bucket_cap_mb) == (50, None)


def test_a_run_of_it_is_stored_and_the_anatomy_page_names_its_buffers(shared_states, store):
    from anatomy.analysis.report import report
    from anatomy.prediction import breakdown
    from anatomy.views.anatomy import rank_rows

    options = RunOptions(model="tiny", seq_len=32, processes=2, strategy=NAME)
    run_id = store.create_run(options.to_dict(), "cpu-rss", "rss", 0,
                              {"world_size": 2, "strategy": NAME})
    store.write(run_id, phases=[PhaseMark(edge, "training", t, rank=rank) for rank in (0, 1)
                                for edge, t in (("start", 1.0), ("end", 2.0))])
    rep = report(store, run_id)
    assert rep.strategy == NAME and rep.devices == "2 × CPU (shared-states)"
    predicted = breakdown.rank_prediction_for(rep)
    assert predicted.strategy == NAME and predicted.buffers[GATHER] > 0
    rows = [row for row in rank_rows(rep, predicted) if row.component.startswith("the states'")]
    assert [(row.gpu, row.component) for row in rows] == [
        ("rank 0", "the states' gather buffer (in the peak)"),
        ("rank 1", "the states' gather buffer (in the peak)")]
    assert rows[0].predicted == mib_text(predicted.buffers[GATHER])

"""The model a run carries (analysis/carried_model.py): what each front keeps of it, and every
reader — the prediction, `show`, an export imported elsewhere — reading that copy rather than a
path that named the model where the run started. The Anatomy page's side is
test_anatomy_page.py's."""

from __future__ import annotations

import json

from anatomy import cli
from anatomy.analysis import carried_model, models, transfer
from anatomy.analysis.report import report
from anatomy.prediction import Prediction, breakdown
from tests.conftest import USERS_MODEL


def test_a_config_file_named_relatively_is_kept_as_read_with_its_absolute_path(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.json").write_text(json.dumps(USERS_MODEL))
    facts = carried_model.kept(models.resolve("mine.json"))
    assert (facts.model, facts.model_source) == ("mine", "config file")
    assert facts.model_path == str(tmp_path / "mine.json")
    assert facts.model_config == USERS_MODEL


def test_a_preset_is_kept_by_its_name_alone():
    facts = carried_model.kept(models.resolve("tiny"))
    assert (facts.model, facts.model_source, facts.model_config, facts.model_path) == \
        ("tiny", "preset", None, None)


def test_a_trainers_model_from_a_folder_keeps_its_config_and_the_folder(tmp_path, monkeypatch):
    """The callback's side: the config as transformers writes it, the head as its architecture,
    and the folder `from_pretrained` read (named relatively by the script) made absolute."""
    from transformers import BertConfig, BertForSequenceClassification

    monkeypatch.chdir(tmp_path)
    BertForSequenceClassification(BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        vocab_size=1000)).save_pretrained("my-bert")
    model = BertForSequenceClassification.from_pretrained("my-bert")
    facts = carried_model.trained(model.config, type(model).__name__)
    assert (facts.model_class, facts.model_name) == ("BertForSequenceClassification", "my-bert")
    assert facts.model_path == str(tmp_path / "my-bert")
    assert facts.model_config["architectures"] == ["BertForSequenceClassification"]
    assert facts.model_config["hidden_size"] == 64


def test_show_names_where_the_model_came_from(store, model_gone, tmp_path, capsys):
    run_id = model_gone()
    assert cli.main(["show", str(run_id), "--store", str(store.path)]) == 0
    assert (f"model: my-bert from model folder {tmp_path / 'project' / 'my-bert'} (its config "
            "kept in the run)") in capsys.readouterr().out.splitlines()


def test_an_exported_run_imported_elsewhere_is_predicted_from_the_config_it_kept(
        store, model_gone, target):
    """The run's file stayed on the machine it was exported from (here: deleted): the import
    predicts it as the run did where it started."""
    run_id = model_gone()
    here = breakdown.predicted(report(store, run_id))
    (imported,) = transfer.import_runs(target, json.dumps(transfer.export_runs(store, [run_id])))
    there = breakdown.predicted(report(target, imported))
    assert isinstance(there, Prediction), there
    assert there == here
    # BertForSequenceClassification of the folder's config (hidden 64, 2 layers, 1000 tokens)
    assert there.parameters == 139_586

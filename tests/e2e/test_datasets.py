"""`anatomy run` on a user's dataset (saved with save_to_disk, or JSON lines) and its tokenizer
(saved with save_pretrained), as a user runs it: the run trains on the texts, padded by
transformers' collators, stores what it trained on, and measures on this CPU what `anatomy
predict` says of the longest batch the data can form, to the byte. Bad input: one line, nothing
started, nothing stored."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from anatomy.analysis.lengths import TextBatch
from anatomy.analysis.report import report
from anatomy.prediction.breakdown import data_reach, predicted
from anatomy.store import Store
from anatomy.views import anatomy as anatomy_view
from anatomy.views.text import measured_text_batch
from tests.conftest import make_text_data

COMPARED = ("weights", "gradients", "optimizer_states", "activations")


def anatomy(*args: str, store) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anatomy", *args, "--store", str(store)],
                          capture_output=True, text=True, timeout=300)


def predict(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anatomy", "predict", *args, "--device", "cpu"],
                          capture_output=True, text=True, timeout=300)


def _data_flags(dataset, text_data, *more: str) -> list[str]:
    return ["--dataset", str(dataset), "--tokenizer", str(text_data.tokenizer), *more]


# tiny-llama holds an attention mask where a batch has padding: the trace must pad as the
# collator does (with the dummy data's unpadded batch of 4 × 30 it predicted 2,235,992 bytes
# of activations; the run measures 2,355,576).
CASES = {
    # one batch of all four texts: every step is the longest batch, padded to the longest
    "longest": ("dataset", ["--batch-size", "4"]),
    # batches of two of the four texts, each padded to max_length: every batch is the longest
    "max_length": ("lines", ["--batch-size", "2", "--padding", "max_length",
                             "--max-length", "40"]),
}


@pytest.mark.parametrize("case", CASES)
def test_the_cpu_prediction_at_the_longest_batch_is_what_the_run_measures(text_data, tmp_path,
                                                                           case):
    which, more = CASES[case]
    flags = ["--model", "tiny-llama", "--max-steps", "2",
             *_data_flags(getattr(text_data, which), text_data, *more)]
    store = tmp_path / "runs.sqlite"
    run = anatomy("run", *flags, "--sample-rate", "50", store=store)
    assert run.returncode == 0, run.stderr
    assert "data: " in run.stdout and "4 texts, 61 tokens" in run.stdout
    said = predict(*flags, "--json")
    assert said.returncode == 0, said.stderr
    said = json.loads(said.stdout)
    rep = report(Store(store), 1)
    measured = {k: getattr(rep.components, k) for k in COMPARED}
    assert {k: said["components"][k] for k in COMPARED} == measured
    # the run keeps what it trained on: a reader predicts it again from the store alone
    data = rep.environment.data
    assert data.dataset == str(getattr(text_data, which).resolve())
    assert data.tokenizer == str(text_data.tokenizer.resolve())
    assert sorted(n for n, count in data.lengths for _ in range(count)) == \
        sorted(text_data.lengths)
    assert {k: getattr(predicted(rep), k) for k in COMPARED} == measured
    assert said["dataset"]["longest_padded_to"] == (40 if case == "max_length" else 30)


# Twelve texts, batches of four: each of a shuffled epoch's three batches is padded to its own
# longest text, and the probe measures the third.
VARIED = (9, 30, 5, 17, 12, 8, 25, 6, 14, 11, 20, 7)


def test_the_measured_components_are_predicted_at_the_batch_they_were_measured_on(tmp_path):
    """Padded to each batch's longest, the steps the probe measures hold whatever batches the
    shuffle drew, not the longest: the run's own prediction is made at the batch it measured
    (equal to the byte on this CPU), and the longest batch's apart, as what the data can reach
    (tiny-llama measured 1,071,416 bytes of activations on the shuffle's 4 × 17 tokens, and was
    held against 1,903,208 predicted at the longest batch, 4 × 30)."""
    texts = make_text_data(tmp_path / "data", VARIED)
    store = tmp_path / "runs.sqlite"
    run = anatomy("run", "--model", "tiny-llama", "--max-steps", "3", "--sample-rate", "50",
                  "--batch-size", "4", *_data_flags(texts.dataset, texts), store=store)
    assert run.returncode == 0, run.stderr
    rep = report(Store(store), 1)
    measured = {k: getattr(rep.components, k) for k in COMPARED}
    batch = measured_text_batch(rep)
    assert batch is not None and batch.size == 4 and batch.padded_to == max(batch.lengths)
    reach = data_reach(rep)
    assert reach.longest == TextBatch((30, 25, 20, 17), 30) and reach.measured == batch
    assert batch != reach.longest  # the batch measured is not the longest: the case at hand
    assert {k: getattr(predicted(rep), k) for k in COMPARED} == measured
    assert reach.prediction.activations > measured["activations"]
    shown = anatomy("show", "1", store=store)
    assert f"measured on a micro-batch of {batch.words()}" in shown.stdout
    assert "the data's longest batch: 4 × 30 tokens" in shown.stdout
    assert anatomy_view.reach_line(rep, reach).startswith(
        "What the data can reach: its longest batch, 4 × 30 tokens, its texts 17 to 30 tokens "
        "long, is predicted to peak at ")


def test_bad_input_to_run_is_one_line_and_starts_nothing(text_data, tmp_path):
    store = tmp_path / "runs.sqlite"
    refused = anatomy("run", "--model", "tiny-llama", "--text-column", "body",
                      *_data_flags(text_data.dataset, text_data), store=store)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("error: text_column: 'body' is not a column of ")
    assert refused.stderr.endswith("(train: its columns are text, label)\n")
    assert not store.exists() or Store(store).runs() == []
    image = anatomy("run", "--model", "tiny-vit", *_data_flags(text_data.dataset, text_data),
                    store=store)
    assert image.returncode == 2 and image.stderr.count("\n") == 1
    assert "a model for image classification" in image.stderr
    assert not store.exists() or Store(store).runs() == []


# Root reads whatever its permissions say: a check of them runs in a process without root's
# capability to override them (setpriv), as a user's own process runs.
NO_OVERRIDE = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
               "--bounding-set=-dac_override,-dac_read_search", "--"]


def as_a_user(*args: str, store) -> subprocess.CompletedProcess:
    """`anatomy …` in a process of a user's permissions."""
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root reads every file, and setpriv is not here to make it a user")
        prefix = NO_OVERRIDE
    return subprocess.run([*prefix, sys.executable, "-m", "anatomy", *args, "--store",
                           str(store)], capture_output=True, text=True, timeout=300)


def test_a_dataset_that_cannot_be_read_is_refused_as_such_whatever_part_of_it(text_data,
                                                                              tmp_path):
    """A saved DatasetDict whose train split's folder the user may not read trained on its test
    split (read as a folder of arrow files), and said so only in "(test, …)"; a saved Dataset
    whose table may not be read was a traceback (pyarrow's PermissionError); a folder that may
    not be listed was "no dataset: neither saved with save_to_disk … nor a folder of data
    files". Each is one line: permission denied, and where; nothing starts."""
    splits = tmp_path / "splits"
    shutil.copytree(text_data.splits, splits)
    saved = tmp_path / "saved"
    shutil.copytree(text_data.dataset, saved)
    shut = tmp_path / "shut"
    shut.mkdir()
    shutil.copy(text_data.lines, shut / "train.jsonl")
    lines = tmp_path / "lines.jsonl"
    shutil.copy(text_data.lines, lines)
    table = next(saved.glob("*.arrow"))
    locked = [splits / "train", table, shut, lines]
    store = tmp_path / "runs.sqlite"
    try:
        for path in locked:
            path.chmod(0)
        for path, where in [(splits, "'train'"), (saved, repr(table.name)), (shut, None),
                            (lines, None)]:
            refused = as_a_user("run", "--model", "tiny-llama", "--max-steps", "1",
                                *_data_flags(path, text_data), store=store)
            said = "' cannot be read: permission denied" + (f": {where}" if where else "")
            assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
            assert refused.stderr.startswith("error: dataset: '"), refused.stderr
            assert refused.stderr.endswith(said + "\n"), refused.stderr
    finally:
        for path in locked:
            path.chmod(0o755)
    assert not store.exists() or Store(store).runs() == []

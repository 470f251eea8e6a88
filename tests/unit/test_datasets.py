"""A user's dataset: its lengths and the batches they form, its checks (each bad input one line,
naming its option, starting nothing), its tokens, the batch the prediction traces held to the
one transformers' collators make, and the form's histogram. The run on it, measured and held to
the prediction: tests/e2e/test_datasets.py."""

from __future__ import annotations

import itertools
import json
import shutil
from dataclasses import replace

import pytest
from streamlit.testing.v1 import AppTest

from anatomy.analysis import data, models
from anatomy.analysis.lengths import (
    MAX_LENGTH,
    Lengths,
    TextBatch,
    longest_batches,
    typical_batch,
)
from anatomy.analysis.options import RunOptions, validate
from anatomy.cli import main
from anatomy.dashboard.widgets import INTERACTIVE
from anatomy.store import RunFacts
from anatomy.store.checks import InvalidValue
from tests.apptest import APP
from tests.conftest import words


def on(text_data, **changes) -> RunOptions:
    """A run of tiny-llama on the test's dataset, as `anatomy run --dataset … --tokenizer …`."""
    options = RunOptions(model="tiny-llama", batch_size=4, max_steps=2,
                         dataset=str(text_data.dataset), tokenizer=str(text_data.tokenizer))
    return replace(options, **changes)


# --- the lengths ---

def test_the_longest_batch_is_the_longest_texts_padded_to_the_longest():
    lengths = Lengths.of([5, 9, 17, 30, 3, 30, 8])
    (batch,) = longest_batches(lengths, 3, "longest", 0)
    assert batch == TextBatch((30, 30, 17), 30)
    assert longest_batches(lengths, 3, MAX_LENGTH, 64)[0] == TextBatch((30, 30, 17), 64)


def test_a_longest_batch_without_padding_is_weighed_against_one_with_it():
    """Texts cut at their limit are all as long as the batch: its B longest hold no padding, and
    a batch with padding makes a model hold its attention mask, which one without skips."""
    lengths = Lengths.of([512] * 6 + [100, 40])
    assert longest_batches(lengths, 4, "longest", 512) == (
        TextBatch((512,) * 4, 512), TextBatch((512, 512, 512, 100), 512))
    assert longest_batches(Lengths.of([7] * 4), 4, "longest", 0) == (TextBatch((7,) * 4, 7),)


def test_the_typical_batch_is_the_median_over_a_shuffled_epochs_batches():
    lengths = [3, 5, 8, 9, 12, 17, 30, 31]
    for size in (1, 2, 3, 4):
        # every batch a shuffle can form, equally likely
        longest = [max(batch) for batch in itertools.combinations(lengths, size)]
        median = sorted(longest)[(len(longest) - 1) // 2]
        assert Lengths.of(lengths).median_batch_longest(size) == median
    assert typical_batch(Lengths.of(lengths), 4, "longest", 0).padded_to == \
        Lengths.of(lengths).median_batch_longest(4)


def test_quantiles_and_histogram_count_every_text():
    lengths = Lengths.of(range(1, 101))
    assert lengths.quantiles() == {"min": 1, "10%": 10, "median": 50, "90%": 90, "99%": 99,
                                   "max": 100}
    bins = lengths.histogram(10)
    assert [count for *_, count in bins] == [10] * 10 and bins[0][:2] == (1, 10)
    assert "100 texts, 5,050 tokens" in lengths.words()


def test_a_run_keeps_its_lengths_and_an_import_refuses_wrong_ones():
    facts = RunFacts.of(data={"dataset": "/d", "padding": "longest", "lengths": [[3, 2]]})
    assert RunFacts.from_dict(facts.to_dict()).data.lengths == ((3, 2),)
    with pytest.raises(InvalidValue, match=r"environment.data.lengths\[0\]: must be a pair"):
        RunFacts.from_dict({"data": {"lengths": [[3]]}}, "environment")


# --- what is refused, in one line, before anything starts ---

def test_a_dataset_trains_when_its_data_tokenizer_and_model_fit(text_data):
    assert validate(on(text_data), gpu_count=0) == {}
    assert validate(on(text_data, dataset=str(text_data.lines)), gpu_count=0) == {}
    assert validate(on(text_data, dataset=str(text_data.splits), split="test", batch_size=1),
                    gpu_count=0) == {}


def _refused(options: RunOptions) -> tuple[str, str]:
    (field, message), = validate(options, gpu_count=0).items()
    assert "\n" not in message and message.startswith(field + ": ")
    return field, message


def test_every_bad_input_is_one_line_naming_its_option(text_data, tmp_path):
    import datasets

    empty = tmp_path / "empty"
    datasets.Dataset.from_dict({"text": []}, features=datasets.Features(
        {"text": datasets.Value("string")})).save_to_disk(str(empty))
    numbers = tmp_path / "numbers"
    datasets.Dataset.from_dict({"text": [1, 2, 3, 4]}).save_to_disk(str(numbers))
    holes = tmp_path / "holes"
    datasets.Dataset.from_dict({"text": ["a cat", None, "a dog", "the mat"]}).save_to_disk(
        str(holes))
    (tmp_path / "notes.docx").write_text("a cat\n")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "header.csv").write_text("text,label\n")
    (tmp_path / "not.jsonl").write_text("a cat\n")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.docx").write_text("a cat\n")
    (tmp_path / "blank.csv").write_text('text,label\n"",0\n"",1\n')  # read as floats (NaN)
    (tmp_path / "content.jsonl").write_text('{"content": "a cat", "title": "a", "label": 1}\n')
    cases = {
        "a missing column": (on(text_data, text_column="body"),
                             "text_column", "its columns are text, label"),
        # none named, none of the usual names there, nor one column of text alone: not
        # "'text' is not a column", which the user never wrote
        "no column of a usual name": (
            on(text_data, dataset=str(tmp_path / "content.jsonl")), "text_column",
            "has no column of a usual name (text, messages, prompt+completion) nor one column of "
            "text alone (train: its columns are content, title, label): name the column of "
            "texts, or two joined by + (content+title)"),
        "a tokenizer not in the cache": (on(text_data, tokenizer="someone/tokenizer"),
                                         "tokenizer", "nor a tokenizer in the local"),
        "a tokenizer folder that is none": (on(text_data, tokenizer=str(tmp_path)),
                                            "tokenizer", "holds no tokenizer"),
        # datasets 5's loader finds no table in it ("holds a split of no rows"), 2.19 loads it
        # empty ("is empty"): no text either way
        # The dataset is at fault where no split was named (the form marked Split, left empty)
        "an empty split": (on(text_data, dataset=str(empty)), "dataset", "no text to train on"),
        "an empty file": (on(text_data, dataset=str(tmp_path / "empty.jsonl")), "dataset",
                          "is empty: no text"),
        "a file of a header alone": (on(text_data, dataset=str(tmp_path / "header.csv")),
                                     "dataset", "holds no rows"),
        "a file that is not what it says": (on(text_data, dataset=str(tmp_path / "not.jsonl")),
                                            "dataset", "cannot be read as json"),
        "texts that are not text": (on(text_data, dataset=str(numbers)), "text_column",
                                    "holds int64, not text"),
        "texts missing": (on(text_data, dataset=str(holes)), "text_column",
                          "1 of the 4 rows of 'text' hold no text"),
        "texts all blank": (on(text_data, dataset=str(tmp_path / "blank.csv")), "text_column",
                            "blank.csv' holds no text: each of its 2 rows is empty"),
        "a path that is not a dataset": (on(text_data, dataset=str(tmp_path / "notes.docx")),
                                         "dataset", "is not a dataset"),
        "a folder that is not a dataset": (on(text_data, dataset=str(tmp_path / "notes")),
                                           "dataset", "neither saved with save_to_disk (it has "
                                           "no dataset_info.json or dataset_dict.json) nor a "
                                           "folder of data files"),
        "no such file": (on(text_data, dataset=str(tmp_path / "gone.jsonl")), "dataset",
                         "no such file or folder"),
        "a split not there": (on(text_data, dataset=str(text_data.splits), split="validation"),
                              "split", "its splits: train, test"),
        "a split of a Dataset": (on(text_data, split="test"), "split", "saved without splits"),
        "an image model": (on(text_data, model="tiny-vit"), "dataset",
                           "a model for image classification"),
        "fewer texts than a batch": (on(text_data, batch_size=5), "dataset",
                                     "4 texts, fewer than one batch of 5"),
        "a length past the model's": (on(text_data, max_length=10**6), "max_length",
                                      "out of range for tiny-llama"),
        "a dataset without its tokenizer": (on(text_data, tokenizer=""), "tokenizer",
                                            "a dataset's texts need one"),
        "a tokenizer without a dataset": (on(text_data, dataset=""), "tokenizer",
                                          "give --dataset too"),
    }
    for name, (options, field, words_) in cases.items():
        found = _refused(options)
        assert found[0] == field and words_ in found[1], (name, found)


def test_a_folder_without_a_tokenizer_is_refused_in_a_whole_sentence(text_data, tmp_path):
    """A model's folder (its config.json alone) given as the tokenizer: transformers makes an
    empty tokenizer from the config, every text became no token and the prediction stopped in
    the model's code ("cannot reshape tensor of 0 elements"). An empty folder's refusal ended
    on transformers' first line, cut at a comma ("… from one of: (1) a `tokenizers` library
    serialization file,")."""
    from transformers import AutoConfig

    model_folder = tmp_path / "my-qwen2"
    AutoConfig.for_model("qwen2", num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                         num_attention_heads=4, num_key_value_heads=2).save_pretrained(
        model_folder)
    empty = tmp_path / "nothing"
    empty.mkdir()
    for folder in (model_folder, empty):
        field, message = _refused(on(text_data, tokenizer=str(folder)))
        assert field == "tokenizer" and "holds no tokenizer" in message, message
        assert message.endswith((")", ".")) and not message.endswith("..."), message


def test_a_dataset_that_is_not_there_is_said_beside_the_missing_tokenizer(tmp_path):
    """No tokenizer and a dataset path that names nothing: only the tokenizer was refused, and
    the missing file said at the next Start, once a tokenizer was given."""
    for dataset in (str(tmp_path / "nope.jsonl"), "./reviews", "~/nope"):
        errors = validate(RunOptions(model="tiny-llama", dataset=dataset), 0)
        assert set(errors) == {"dataset", "tokenizer"}, errors
        assert errors["dataset"].startswith("dataset: no such file or folder: '")
        assert errors["dataset"].endswith(f"{dataset[-6:]}'"), errors  # a long path is cut
    # a Hub id is looked for in the local cache later, with a tokenizer
    assert set(validate(RunOptions(model="tiny-llama", dataset="imdb"), 0)) == {"tokenizer"}


def test_a_model_folder_saved_with_its_tokenizer_tokenizes_the_dataset_itself(text_data,
                                                                              tmp_path):
    """A model and its tokenizer saved in one folder (as `save_pretrained` of both writes it, as
    every Hub snapshot holds them) was refused "a dataset's texts need one" without
    --tokenizer naming the same folder again. Its own tokenizer is taken, and stored as named."""
    from transformers import AutoTokenizer, LlamaConfig

    folder = tmp_path / "my-llama"
    LlamaConfig(**models.PRESETS["tiny-llama"].config_dict()).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(text_data.tokenizer)).save_pretrained(folder)
    options = on(text_data, model=str(folder), tokenizer="")
    assert validate(options, 0) == {}
    assert RunOptions.read({"model": str(folder), "dataset": options.dataset}).tokenizer == \
        str(folder)
    # a folder without one is still refused, naming where the tokenizer may come from
    (folder / "tokenizer.json").unlink()
    assert _refused(options) == ("tokenizer", "tokenizer: a dataset's texts need one: a folder "
                                 "saved with save_pretrained, or a Hub id in the local cache (the "
                                 "model's own where its folder holds a tokenizer.json)")


def test_a_dataset_run_is_not_refused_for_the_sequence_length_it_ignores(text_data):
    """The form sends its (greyed) sequence length with a dataset: 512 against a model of 256
    positions refused the run for a length its texts, cut at the positions, never take."""
    assert "seq_len" not in validate(on(text_data, seq_len=4096), 0)
    assert "seq_len" in validate(on(text_data, seq_len=4096, dataset="", tokenizer=""), 0)


def test_a_vocabulary_larger_than_the_models_is_refused(text_data, tmp_path):
    config = {**models.PRESETS["tiny-llama"].config_dict(), "vocab_size": 8}
    path = tmp_path / "small-vocab.json"
    path.write_text(json.dumps(config))
    field, message = _refused(on(text_data, model=str(path)))
    assert field == "tokenizer" and "(18 tokens) is larger than" in message


def test_bad_input_to_predict_is_one_line_and_traces_nothing(text_data, capsys, monkeypatch):
    from anatomy import prediction

    monkeypatch.setattr(prediction.memory, "_recording", lambda *a, **k: pytest.fail("traced"))
    code = main(["predict", "--model", "tiny-llama", "--dataset", str(text_data.dataset),
                 "--tokenizer", str(text_data.tokenizer), "--text-column", "body"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: text_column: 'body' is not a column")


def test_texts_of_no_token_enough_for_a_batch_are_refused_before_anything_starts(
        text_data, tmp_path, capsys, monkeypatch):
    """Empty texts (a blank line of a corpus, spaces alone) are no token: a batch of them alone
    was a tensor of no length, and the run failed in the model's code with a traceback
    ("cannot reshape tensor of 0 elements"), predict with its last line. Fewer of them than a
    batch are padded beside texts that have tokens, and train."""
    import datasets

    blank = tmp_path / "blank"
    datasets.Dataset.from_dict({"text": ["", "  ", "", "", words(3), words(5)]}).save_to_disk(
        str(blank))
    monkeypatch.setattr(data, "_tokens_dir", lambda: tmp_path / "tokens")
    with pytest.raises(data.DataError) as refused:
        data.prepared(on(text_data, dataset=str(blank), batch_size=2))
    assert refused.value.field == "text_column" and "\n" not in str(refused.value)
    assert "4 of the 6 texts of 'text' are no token" in str(refused.value), refused.value
    options, found = data.prepared(on(text_data, dataset=str(blank), batch_size=5))
    assert found.lengths.texts == 6
    monkeypatch.setattr(data, "_tokens_dir", lambda: tmp_path / "tokens-2")
    code = main(["predict", "--model", "tiny-llama", "--device", "cpu", "--batch-size", "2",
                 "--dataset", str(blank), "--tokenizer", str(text_data.tokenizer)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: text_column: "), err


def test_a_text_files_blank_lines_part_its_paragraphs_and_are_no_texts(text_data, tmp_path,
                                                                      monkeypatch):
    """A plain text file with a blank line between its paragraphs: each blank line was a text
    of no token, and once they were a batch's worth the run was refused ("filter them out
    first (Dataset.filter)", which a text file's user cannot). Its blank lines are left out, as
    transformers' run_mlm.py reads a file line by line; a JSON file's empty text stays a row."""
    import json

    monkeypatch.setattr(data, "_tokens_dir", lambda: tmp_path / "tokens")
    lines = [words(3), "", words(5), "   ", words(4), "", "", words(6)]
    folder = tmp_path / "corpus"
    folder.mkdir()
    for where in (tmp_path / "corpus.txt", folder / "train.txt"):
        where.write_text("\n".join(lines) + "\n")
        options, found = data.prepared(on(text_data, dataset=str(where), batch_size=2))
        assert found.lengths.texts == 4 and found.lengths.at_most(0) == 0, (where, found)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    with pytest.raises(data.DataError, match="4 of the 8 texts of 'text' are no token"):
        data.prepared(on(text_data, dataset=str(rows), batch_size=2))


def test_a_json_object_holding_its_rows_under_a_key_is_read_by_its_rows(text_data, tmp_path,
                                                                        monkeypatch):
    """{"version": …, "data": [{"text": …}, …]}, as SQuAD's files are: datasets read the object
    as one row, and the run was refused as "holds 1 text, fewer than one batch". Its rows are
    read, as datasets reads them with field="data"; an object with two such lists is refused
    naming both."""
    import json

    monkeypatch.setattr(data, "_tokens_dir", lambda: tmp_path / "tokens")
    rows = [{"text": words(3 + i), "label": i % 2} for i in range(6)]
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"version": "1.1", "data": rows}))
    options, found = data.prepared(on(text_data, dataset=str(one), batch_size=2))
    assert found.lengths.texts == 6 and found.facts.text_column == "text"
    two = tmp_path / "two.json"
    two.write_text(json.dumps({"train": rows, "test": rows}))
    with pytest.raises(data.DataError, match="lists of rows under 'train', 'test'"):
        data.prepared(on(text_data, dataset=str(two), batch_size=2))


def test_predict_says_a_datasets_sizes_in_mib_and_its_cut_in_tokens(text_data, capsys):
    """predict's typical batch said "… MB for tensors" under its table in MiB, and "cut at 512"
    without a unit."""
    import re

    code = main(["predict", "--model", "tiny-llama", "--device", "cpu", "--batch-size", "2",
                 "--dataset", str(text_data.dataset), "--tokenizer", str(text_data.tokenizer)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert not re.search(r"\b[KMGT]B\b", out), out
    assert ", cut at 512 tokens" in out
    assert re.search(r"^a typical batch \(2 × \d+ tokens\) should need about \d+ MiB for "
                     r"tensors$", out, re.MULTILINE), out


# --- the tokens ---

def test_each_texts_tokens_are_its_words_whatever_file_holds_it(text_data, monkeypatch):
    import datasets

    spec = models.resolve("tiny-llama")
    found = data.tokenized(on(text_data), spec, progress=False)
    assert found.lengths == Lengths.of(text_data.lengths)
    assert found.facts.dataset == str(text_data.dataset.resolve())
    assert found.facts.tokenizer == str(text_data.tokenizer.resolve())
    assert (found.facts.split, found.facts.text_column, found.facts.inputs) == \
        ("train", "text", ("attention_mask",))
    lines = data.tokenized(on(text_data, dataset=str(text_data.lines)), spec, progress=False)
    assert lines.lengths == found.lengths
    # A folder of data files, as a dataset's repository holds them: its splits by their names.
    repository = text_data.lines.parent / "repository"
    repository.mkdir()
    (repository / "train.jsonl").write_bytes(text_data.lines.read_bytes())
    (repository / "test.jsonl").write_text(json.dumps({"text": "the cat"}) + "\n")
    assert data.tokenized(on(text_data, dataset=str(repository)), spec, progress=False
                          ).lengths == found.lengths
    assert data.tokenized(on(text_data, dataset=str(repository), split="test", batch_size=1),
                          spec, progress=False).lengths == Lengths.of([2])
    hub = text_data.lines.parent / "hub-layout"  # a Hub dataset's repository: data/ of shards
    (hub / "data").mkdir(parents=True)
    datasets.Dataset.from_json(str(text_data.lines)).to_parquet(
        str(hub / "data" / "train-00000-of-00001.parquet"))
    assert data.tokenized(on(text_data, dataset=str(hub)), spec, progress=False).lengths == \
        found.lengths
    # tokenized once: the second time from the cache
    monkeypatch.setattr(data, "_tokenize", lambda *a: pytest.fail("tokenized again"))
    assert data.tokenized(on(text_data), spec, progress=False).folder == found.folder


@pytest.mark.parametrize("name", ["texts.tsv", "texts.txt", "texts.ndjson", "texts.jsonl.gz",
                                  "texts.csv.bz2", "texts.txt.xz", "texts.arrow"])
def test_each_text_format_datasets_reads_is_a_dataset(text_data, tmp_path, name):
    """A TSV, a text file (a text a line), an Arrow stream, a compressed JSON-lines file … were
    "not a dataset": datasets reads each of them, and its texts are the same texts."""
    import bz2
    import gzip
    import lzma

    import pyarrow as pa

    spec = models.resolve("tiny-llama")
    texts = [json.loads(line)["text"] for line in text_data.lines.read_text().splitlines()]
    path = tmp_path / name
    opened = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(path.suffix, open)
    if name.endswith(".arrow"):
        table = pa.table({"label": [0] * len(texts), "text": texts})
        with pa.ipc.new_stream(str(path), table.schema) as stream:
            stream.write_table(table)
    else:
        with opened(path, "wt") as file:
            if ".tsv" in name:
                file.write("label\ttext\n" + "".join(f"0\t{text}\n" for text in texts))
            elif ".csv" in name:
                file.write("text,label\n" + "".join(f"{text},0\n" for text in texts))
            elif ".txt" in name:
                file.write("".join(f"{text}\n" for text in texts))
            else:
                file.write("".join(json.dumps({"text": text}) + "\n" for text in texts))
    found = data.tokenized(on(text_data, dataset=str(path)), spec, progress=False)
    assert found.lengths == Lengths.of(text_data.lengths)


def test_a_chat_datasets_conversations_are_tokenized_as_their_chat_template_writes_them(
        text_data, tmp_path):
    """A "messages" column (a list of role and content, as chat datasets hold them) was refused:
    "holds list, not text". Its conversations are the texts the tokenizer's chat template writes
    of them, tokenized without further special tokens (TRL's SFTTrainer's way)."""
    import datasets
    from transformers import AutoTokenizer

    template = "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}"
    tokenizer = AutoTokenizer.from_pretrained(str(text_data.tokenizer))
    tokenizer.chat_template = template
    tokenizer.save_pretrained(str(tmp_path / "chat-tokenizer"))
    conversations = [[{"role": "user", "content": words(n)},
                      {"role": "assistant", "content": words(2 * n, seed=1)}]
                     for n in (3, 8, 5, 1, 13, 2)]
    chat = tmp_path / "chat"
    datasets.Dataset.from_dict({"messages": conversations, "id": list(range(6))}).save_to_disk(
        str(chat))
    lines = tmp_path / "chat.jsonl"
    lines.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations))
    expected = Lengths.of([len(tokenizer(tokenizer.apply_chat_template(c, tokenize=False),
                                         add_special_tokens=False)["input_ids"])
                           for c in conversations])
    spec = models.resolve("tiny-llama")
    for dataset in (chat, lines):  # the column taken where there is no "text"
        found = data.tokenized(on(text_data, dataset=str(dataset), batch_size=2,
                                  tokenizer=str(tmp_path / "chat-tokenizer")), spec,
                               progress=False)
        assert found.lengths == expected and found.facts.text_column == "messages"
    with pytest.raises(data.DataError, match="has no chat template: 'messages' holds "
                       "conversations") as refused:
        data.prepared(on(text_data, dataset=str(chat), batch_size=2))
    assert refused.value.field == "tokenizer"
    tokenizer.chat_template = "{{ raise_exception('Conversation roles must alternate') }}"
    tokenizer.save_pretrained(str(tmp_path / "strict-tokenizer"))
    with pytest.raises(data.DataError, match="a conversation the tokenizer's chat template "
                       "refuses: Conversation roles must alternate") as refused:
        data.prepared(on(text_data, dataset=str(chat), batch_size=2,
                         tokenizer=str(tmp_path / "strict-tokenizer")))
    assert refused.value.field == "text_column" and "\n" not in str(refused.value)


def test_a_prompt_completion_dataset_trains_on_each_prompt_followed_by_its_completion(
        text_data, tmp_path):
    """TRL's prompt-completion format ("prompt" and "completion" columns, text or conversations)
    was refused "'text' is not a column", and `--text-column prompt` would have predicted the
    prompts alone. Each text is its prompt followed by its completion, as TRL's SFTTrainer
    tokenizes them: strings joined, conversations through the chat template one after the
    other; the pair is named "prompt+completion", and --text-column may name it too."""
    import datasets
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(text_data.tokenizer))
    tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}\n"
                               "{% endfor %}")
    tokenizer.save_pretrained(str(tmp_path / "chat-tokenizer"))
    sizes = (3, 8, 5, 1, 13, 2)
    prompts, completions = [words(n) for n in sizes], [" " + words(2 * n, seed=1) for n in sizes]
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"prompt": p, "completion": c, "id": 1}) + "\n"
                             for p, c in zip(prompts, completions)))
    turns = [([{"role": "user", "content": p}], [{"role": "assistant", "content": c}])
             for p, c in zip(prompts, completions)]
    chat = tmp_path / "chat"
    datasets.Dataset.from_dict({"prompt": [p for p, _ in turns],
                                "completion": [c for _, c in turns]}).save_to_disk(str(chat))
    spec = models.resolve("tiny-llama")
    expected = {
        plain: Lengths.of([len(tokenizer(p + c)["input_ids"])
                           for p, c in zip(prompts, completions)]),
        chat: Lengths.of([len(tokenizer(tokenizer.apply_chat_template(p + c, tokenize=False),
                                        add_special_tokens=False)["input_ids"])
                          for p, c in turns])}
    for dataset, column in ((plain, ""), (chat, ""), (plain, "prompt+completion")):
        found = data.tokenized(on(text_data, dataset=str(dataset), batch_size=2,
                                  text_column=column,
                                  tokenizer=str(tmp_path / "chat-tokenizer")), spec,
                               progress=False)
        assert found.lengths == expected[dataset]
        assert found.facts.text_column == "prompt+completion"
    # a half that is not there; a text prompt before a conversation
    field, message = _refused(on(text_data, dataset=str(plain), text_column="prompt+answer"))
    assert message.startswith("text_column: 'answer' is not a column of '") and \
        message.endswith("plain.jsonl' (train: its columns are prompt, completion, id)")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n"
                             for p, (_, c) in zip(prompts, turns)))
    field, message = _refused(on(text_data, dataset=str(mixed)))
    assert field == "text_column" and "joins text and conversations" in message


def test_a_cache_that_cannot_be_written_is_a_temporary_one(text_data, tmp_path, monkeypatch):
    """A file where the cache folder should be (or a read-only home): "cannot be read as
    json: Not a directory" blamed the user's file, then a NotADirectoryError traceback from
    the tokens' cache. The tables and tokens go to a temporary folder of this process."""
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("ANATOMY_CACHE", str(blocked))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    spec = models.resolve("tiny-llama")
    found = data.tokenized(on(text_data, dataset=str(text_data.lines)), spec, progress=False)
    assert found.lengths == Lengths.of(text_data.lengths)
    assert found.folder.startswith(str(tmp_path / "tmp" / "anatomy-cache-")), found.folder


def test_a_full_cache_disk_is_said_as_such_in_one_line(text_data, monkeypatch):
    """A full disk under the cache: numpy's short write ("15782 requested and 992 written")
    and datasets' ENOSPC read as faults of the user's file."""
    import errno

    import datasets

    spec = models.resolve("tiny-llama")

    def short_write(path, array):
        raise OSError(f"{array.nbytes} requested and 992 written")

    monkeypatch.setattr(data.np, "save", short_write)
    with pytest.raises(data.DataError, match="its tokens cannot be written into .*: written in "
                       "part only: its disk is full \\(ANATOMY_CACHE names another folder"):
        data.tokenized(on(text_data, dataset=str(text_data.lines)), spec, progress=False)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(datasets, "load_dataset", full)
    data._load_path.cache_clear()
    with pytest.raises(data.DataError, match="cannot be read into the cache .*: no space left "
                       "on its device \\(ANATOMY_CACHE names another folder\\)"):
        data.tokenized(on(text_data, dataset=str(text_data.lines)), spec, progress=False)


def test_texts_are_cut_at_max_length_or_the_models_positions(text_data):
    spec = models.resolve("tiny-llama")
    cut = data.tokenized(on(text_data, max_length=10), spec, progress=False)
    assert cut.lengths == Lengths.of(min(n, 10) for n in text_data.lengths)
    assert cut.facts.max_length == 10
    assert data.tokenized(on(text_data), spec, progress=False).facts.max_length == \
        spec.max_positions


def test_a_run_on_a_dataset_counts_its_texts_as_its_samples(text_data):
    options, texts = data.prepared(replace(on(text_data), max_steps=None, epochs=3))
    assert options.dataset_size == 4 and texts.lengths.texts == 4
    assert options.total_steps() == 3  # one batch of four an epoch


# --- the batch the prediction traces is the collator's ---

@pytest.mark.parametrize("model,padding", [("tiny-llama", "longest"), ("tiny", "longest"),
                                           ("tiny-gpt2", MAX_LENGTH)])
def test_the_traced_batch_is_the_one_the_collator_pads(text_data, model, padding):
    """engine/dataset.py's items through transformers' collator, and the prediction's batch of
    the same lengths (trainer_step.padded_batch): the same tensors by name, shape, dtype, and
    the same mask and ignored labels."""
    import torch

    from anatomy.engine.dataset import TextDataset
    from anatomy.prediction.tracing.trainer_step import padded_batch

    options = on(text_data, model=model, padding=padding, max_length=40)
    spec = models.resolve(model)
    options, texts = data.prepared(options)
    dataset = TextDataset(spec, texts, seed=0)
    real = dataset.batch(4)
    lengths = tuple(sorted(text_data.lengths, reverse=True))
    order = sorted(range(4), key=lambda i: -text_data.lengths[i])
    traced = padded_batch(spec, TextBatch(lengths, 40 if padding == MAX_LENGTH else 30,
                                          texts.facts.inputs))
    assert {k: (v.shape, v.dtype) for k, v in real.items()} == \
        {k: (v.shape, v.dtype) for k, v in traced.items()}
    assert torch.equal(real["attention_mask"][order], traced["attention_mask"])
    if "labels" in real and real["labels"].dim() == 2:
        assert torch.equal(real["labels"][order] == -100, traced["labels"] == -100)


# --- the form ---

def _form(app: AppTest, **values) -> AppTest:
    """The form filled in: the model picked, the dataset's fields typed."""
    app.selectbox(key="option_model").set_value(values.pop("model"))
    for name, value in values.items():
        app.text_input(key=f"option_{name}").set_value(value)
    return app


def test_the_form_predicts_a_dataset_with_its_lengths_histogram(text_data, store):
    app = AppTest.from_file(APP, default_timeout=60).run()
    app.session_state[INTERACTIVE] = True
    app.number_input(key="option_batch_size").set_value(4)
    _form(app, model="tiny-llama", dataset=str(text_data.dataset),
          tokenizer=str(text_data.tokenizer))
    app.button(key="predict").click().run()
    assert not app.exception
    assert not app.error, [e.value for e in app.error]
    line = next(info.value for info in app.info if info.value.startswith("This run should"))
    assert "at its longest batch (4 × 30 tokens)" in line
    assert any("4 texts, 61 tokens" in caption.value for caption in app.caption)
    (chart,) = [c for c in app.get("plotly_chart") if c.proto.id.endswith("-lengths")]
    bars = json.loads(chart.proto.spec)["data"][0]
    assert sum(bars["y"]) == 4
    assert store.runs() == []


def test_the_form_greys_out_what_a_dataset_decides(text_data, store):
    """With a dataset the sequence length and the dataset size are ignored (its texts decide):
    once the form was sent with one, both are greyed out, each saying why."""
    from anatomy.views.live import DATASET_DECIDES

    app = AppTest.from_file(APP, default_timeout=60).run()
    assert not app.number_input(key="option_seq_len").disabled
    _form(app, model="tiny-llama", dataset=str(text_data.dataset),
          tokenizer=str(text_data.tokenizer))
    app.button(key="predict").click().run()
    assert not app.exception
    for name in ("seq_len", "dataset_size"):
        assert app.number_input(key=f"option_{name}").disabled
        assert DATASET_DECIDES[name] in [caption.value for caption in app.caption]
    assert not app.number_input(key="option_batch_size").disabled


def test_the_time_a_step_of_a_dataset_is_its_typical_batchs(text_data):
    """The time estimate scaled the sequence length a dataset's run ignores: its steps are its
    texts' and its tokens a step its typical batch's (here all four texts, padded to 30)."""
    from anatomy.analysis import duration
    from anatomy.store import TrainingData

    texts = TrainingData(dataset=str(text_data.dataset), padding="longest", max_length=512,
                         lengths=tuple((n, 1) for n in sorted(text_data.lengths)))
    options = RunOptions(model="tiny", batch_size=2, seq_len=512, dataset_size=512,
                         dataset=str(text_data.dataset), tokenizer=str(text_data.tokenizer))
    reference = duration.REFERENCES[("tiny", "cpu-rss")]
    typical = typical_batch(Lengths(texts.lengths), 2, "longest", 512).padded_to
    estimate = duration.estimate_from([], options, "cpu-rss", None, data=texts)
    assert estimate.steps == 2  # four texts, two a batch
    assert estimate.step_s == pytest.approx(reference.step(2 * typical))
    assert typical < 512


def test_bad_input_on_the_form_is_one_line_under_its_field_and_starts_nothing(text_data, store):
    app = AppTest.from_file(APP, default_timeout=60).run()
    _form(app, model="tiny-llama", dataset=str(text_data.dataset),
          tokenizer=str(text_data.tokenizer), text_column="body")
    app.button(key="start").click().run()
    assert not app.exception
    errors = [e.value for e in app.error]
    assert any(e.startswith("'body' is not a column") for e in errors), errors  # under Text column
    assert store.runs() == []


def test_words_make_texts_of_that_many_tokens(text_data):
    tokenizer = data.load_tokenizer(str(text_data.tokenizer))
    assert [len(tokenizer(words(n))["input_ids"]) for n in (1, 7, 30)] == [1, 7, 30]


# --- a stored run keeps what it trained on ---

def test_a_stored_run_on_a_dataset_is_predicted_again_from_its_lengths_after_an_import(tmp_path):
    """The dataset and the tokenizer stayed on the machine that ran it: the run's lengths are
    enough, here and in another store after export and import."""
    from anatomy.analysis import transfer
    from anatomy.analysis.report import report
    from anatomy.prediction import predict
    from anatomy.prediction.breakdown import predicted
    from anatomy.store import Store

    options = RunOptions(model="tiny-llama", batch_size=2, max_steps=2, dataset_size=5,
                         dataset="/elsewhere/reviews", tokenizer="/elsewhere/tok")
    facts = {"data": {"dataset": "/elsewhere/reviews", "split": "train", "text_column": "text",
                      "tokenizer": "/elsewhere/tok", "padding": "longest", "max_length": 512,
                      "inputs": ["attention_mask"], "padding_side": "right",
                      "lengths": [[4, 2], [12, 1], [20, 2]]}}
    source = Store(tmp_path / "source.sqlite")
    run_id = source.create_run(options.to_dict(), "cpu-rss", "rss", 0, facts)
    source.finish(run_id, "completed")
    target = Store(tmp_path / "target.sqlite")
    (imported,) = transfer.import_runs(
        target, json.dumps(transfer.export_runs(source, [run_id]), default=str).encode())
    # its two longest texts hold no padding: one of them beside a shorter one holds the
    # attention mask too (tiny-llama's), as large a peak and more activations
    expected = predict(options, device="cpu", text=TextBatch((20, 12), 20))
    assert expected.activations > predict(options, device="cpu",
                                          text=TextBatch((20, 20), 20)).activations
    for store, run in ((source, run_id), (target, imported)):
        again = predicted(report(store, run))
        assert (again.activations, again.peak) == (expected.activations, expected.peak)


def test_an_import_of_a_tokenizer_without_its_dataset_is_refused_in_one_line(tmp_path):
    from anatomy.analysis import transfer
    from anatomy.store import Store

    source = Store(tmp_path / "source.sqlite")
    options = {**RunOptions(model="tiny-llama").to_dict(), "tokenizer": "/elsewhere/tok"}
    source.finish(source.create_run(options, "cpu-rss", "rss", 0, {}), "completed")
    exported = json.dumps(transfer.export_runs(source, [1]), default=str).encode()
    with pytest.raises(transfer.ImportRefused, match="tokenizer: .* give --dataset too"):
        transfer.import_runs(Store(tmp_path / "target.sqlite"), exported)


def test_show_and_compare_leave_out_what_a_run_ignores(store, seed, capsys):
    """A run on a dataset ignores the sequence length and the dataset size (its texts decide):
    `show` printed seq_len=512 beside the data's lengths, and Compare called two runs on one
    dataset different in them; a run on the dummy data shows no dataset settings; a max length
    of 0 reads as the length the texts were cut at."""
    from anatomy.analysis import compare
    from anatomy.analysis.report import report

    facts = {"dataset": "/elsewhere/reviews", "split": "train", "text_column": "text",
             "tokenizer": "/elsewhere/tok", "padding": "longest", "max_length": 512,
             "inputs": ["attention_mask"], "padding_side": "right", "lengths": [[4, 2], [20, 3]]}
    dummy, ours, other = seed(), seed(), seed()
    for run_id, seq_len in ((ours, 64), (other, 256)):
        store.update_run(run_id, options={**store.run(run_id).options, "seq_len": seq_len,
                                          "dataset_size": 5, "dataset": facts["dataset"],
                                          "tokenizer": facts["tokenizer"]})
        store.merge_environment(run_id, {"data": facts})
    assert main(["show", str(ours), "--store", str(store.path)]) == 0
    (options,) = [line for line in capsys.readouterr().out.splitlines()
                  if line.startswith("options: ")]
    assert "seq_len" not in options and "dataset_size" not in options
    assert "dataset=/elsewhere/reviews" in options and "max_length=512" in options
    assert main(["show", str(dummy), "--store", str(store.path)]) == 0
    (options,) = [line for line in capsys.readouterr().out.splitlines()
                  if line.startswith("options: ")]
    assert "seq_len=512" in options and "padding" not in options and "max_length" not in options
    assert compare.differing_options([report(store, ours), report(store, other)]) == []
    assert compare.differing_options([report(store, dummy), report(store, ours)]) == ["dataset"]
    # The heading: its texts' longest (or the length every batch was padded to), not the seq
    # len the run ignored ("seq len 64" of a run whose texts were 20 tokens at most)
    assert ", texts of up to 20 tokens, " in report(store, ours).title()
    store.merge_environment(other, {"data": {**facts, "padding": "max_length"}})
    assert ", seq len 512, " in report(store, other).title()
    assert ", seq len 512, " in report(store, dummy).title()


def test_a_cache_file_that_cannot_be_written_whole_leaves_nothing(tmp_path, monkeypatch):
    """A full disk midway left its half-written "tmp….part" in the cache folder."""
    from anatomy.analysis import cache

    def fails(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache.os, "replace", fails)
    assert cache.write_atomically(tmp_path / "index.json", b"{}") is False
    assert list(tmp_path.iterdir()) == []


def _stored(store, seed, options: RunOptions, progress: bool = False) -> int:
    """A run stored as `anatomy run` stores one on a dataset: its options and what it read."""
    options, texts = data.prepared(options, progress=progress)
    run_id = seed()
    store.update_run(run_id, options=options.to_dict())
    store.merge_environment(run_id, {"data": texts.facts.to_dict()})
    return run_id


def _shown(store, run_id: int, capsys) -> list[str]:
    assert main(["show", str(run_id), "--store", str(store.path)]) == 0
    return capsys.readouterr().out.splitlines()


def test_show_says_when_the_data_at_a_runs_path_is_no_longer_what_it_trained_on(
        text_data, tmp_path, store, seed, capsys):
    """A run kept its data's path alone: the file overwritten after the run, `show` named the
    same path as though it held what the run trained on. The run keeps its files' fingerprint
    (names, sizes, modification times); a run stored before it did, or whose data is where it
    was, says nothing more."""
    import os

    import datasets

    lines = tmp_path / "reviews.jsonl"
    lines.write_text(text_data.lines.read_text())
    saved = tmp_path / "saved"
    shutil.copytree(text_data.dataset, saved)
    on_lines = _stored(store, seed, on(text_data, dataset=str(lines)))
    on_saved = _stored(store, seed, on(text_data, dataset=str(saved)))
    for run_id in (on_lines, on_saved):
        assert not [line for line in _shown(store, run_id, capsys) if line.startswith("data ")]
    kept = store.run(on_lines).environment.data
    assert len(kept.fingerprint) == 16 and kept.file_bytes == lines.stat().st_size

    before = lines.stat().st_size
    os.utime(lines, (lines.stat().st_atime, lines.stat().st_mtime + 30))  # touched: same bytes
    (touched,) = [line for line in _shown(store, on_lines, capsys) if line.startswith("data ")]
    assert touched.startswith(f"data modified: {lines} may not be what this run trained on (the "
                              f"same {before:,} bytes; modified ")
    with open(lines, "a") as file:
        file.write(json.dumps({"text": words(12)}) + "\n")
    os.utime(lines, (lines.stat().st_atime, lines.stat().st_mtime + 60))
    (changed,) = [line for line in _shown(store, on_lines, capsys) if line.startswith("data ")]
    assert changed.startswith(f"data changed: {lines} is not what this run trained on (then "
                              f"{before:,} bytes, modified ")
    assert f"; now {lines.stat().st_size:,} bytes, modified " in changed
    assert changed.endswith("): the lengths above are the run's own, kept in the store")

    shutil.rmtree(saved)
    datasets.Dataset.from_dict({"text": [words(3)] * 6}).save_to_disk(str(saved))
    (changed,) = [line for line in _shown(store, on_saved, capsys) if line.startswith("data ")]
    assert changed.startswith(f"data changed: {saved} is not what this run trained on (")
    lines.unlink()
    (gone,) = [line for line in _shown(store, on_lines, capsys) if line.startswith("data ")]
    assert gone == (f"data gone: no data is at {lines} now: the lengths above are the run's "
                    "own, kept in the store")
    # a run stored before runs kept a fingerprint: its path gone too, nothing said
    old = seed()
    store.merge_environment(old, {"data": {k: v for k, v in kept.to_dict().items()
                                           if k not in ("fingerprint", "file_bytes", "modified")}})
    assert not [line for line in _shown(store, old, capsys) if line.startswith("data ")]


def test_runs_lists_the_file_or_folder_each_run_trained_on(text_data, tmp_path, store, seed,
                                                          capsys):
    """`anatomy runs` had no column for a run's data: two runs of one model on two datasets
    read alike. The data's file or folder name, cut in its middle where long, so that the
    table keeps its width; nothing for a run on the dummy data."""
    long_name = tmp_path / ("customer-reviews-of-the-winter-season-" + "x" * 30 + ".jsonl")
    long_name.write_text(text_data.lines.read_text())
    dummy = seed()
    on_saved = _stored(store, seed, on(text_data))
    on_long = _stored(store, seed, on(text_data, dataset=str(long_name)))
    assert main(["runs", "--store", str(store.path)]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    start = header.index("data ")
    cells = {int(row.split()[0]): row[start:].split("  ")[0].strip() for row in rows}
    assert cells[on_saved] == "dataset" and cells[dummy] == ""
    assert cells[on_long].endswith("xxx.jsonl") and cells[on_long].startswith("customer-")
    assert "…" in cells[on_long] and len(cells[on_long]) <= 24
    assert main(["runs", "--json", "--store", str(store.path)]) == 0
    listed = {row["id"]: row["dataset"] for row in json.loads(capsys.readouterr().out)}
    assert listed == {dummy: "", on_saved: str(text_data.dataset), on_long: str(long_name)}

"""A user's dataset files as they lie on the disk: what cannot be read (a split gone, a folder of
several formats) is refused in one line naming its option, and what can is read whole — never a
part of it taken for the whole. Files the user may not read: tests/e2e/test_datasets.py."""

from __future__ import annotations

import shutil
from dataclasses import replace

from anatomy.analysis import data, models
from anatomy.analysis.options import RunOptions, validate


def on(text_data, **changes) -> RunOptions:
    """A run of tiny-llama on the test's dataset, as `anatomy run --dataset … --tokenizer …`."""
    options = RunOptions(model="tiny-llama", batch_size=4, max_steps=2,
                         dataset=str(text_data.dataset), tokenizer=str(text_data.tokenizer))
    return replace(options, **changes)


def _refused(options: RunOptions) -> tuple[str, str]:
    """The one option refused and its line (a path in it shortened where long)."""
    (field, message), = validate(options, gpu_count=0).items()
    assert "\n" not in message and message.startswith(field + ": ")
    return field, message


def test_a_saved_dataset_with_a_split_gone_is_refused_not_read_as_its_other_files(
        text_data, tmp_path):
    """A DatasetDict folder whose train split was removed was read as a folder of arrow files:
    its test split, trained on as the whole."""
    splits = tmp_path / "splits"
    shutil.copytree(text_data.splits, splits)
    shutil.rmtree(splits / "train")
    field, message = _refused(on(text_data, dataset=str(splits)))
    assert field == "dataset"
    assert message.startswith("dataset: '") and \
        "', saved with save_to_disk, cannot be read: " in message


def test_a_folder_of_several_formats_is_refused_not_read_in_part(text_data, tmp_path):
    """datasets reads a folder's files of one format alone (the most of them): a folder of two
    JSON-lines files and a CSV file trained on the JSON lines, the CSV's texts left out without
    a word. A hidden file is no data of the folder's, as datasets reads it."""
    import datasets

    rows = datasets.Dataset.from_json(str(text_data.lines))
    folder = tmp_path / "mixed"
    folder.mkdir()
    rows.to_json(str(folder / "a.jsonl"))
    rows.to_json(str(folder / "b.jsonl"))
    rows.to_csv(str(folder / "c.csv"))
    field, message = _refused(on(text_data, dataset=str(folder)))
    assert field == "dataset" and message.startswith("dataset: the folder '")
    assert message.endswith("' holds data files of several formats, and datasets reads those "
                            "of one (2 json files), leaving out c.csv: give a folder of one "
                            "format, or one file")
    (folder / "c.csv").rename(folder / ".c.csv")
    assert validate(on(text_data, dataset=str(folder)), gpu_count=0) == {}


def test_a_run_pads_with_its_tokenizer_as_it_started_though_the_users_folder_went(
        text_data, tmp_path):
    """The worker's collator loaded the tokenizer from the user's folder again as training
    began: a folder removed (or changed) once the run had started failed the run with a
    traceback ("DataError: tokenizer: no such folder"). The tokens' folder keeps the tokenizer
    that made them."""
    from anatomy.engine.dataset import TextDataset

    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(text_data.tokenizer, tokenizer)
    options, texts = data.prepared(on(text_data, tokenizer=str(tokenizer)), progress=False)
    shutil.rmtree(tokenizer)
    batch = TextDataset(models.resolve("tiny-llama"), texts, seed=0).batch(4)
    assert batch["input_ids"].shape == (4, max(text_data.lengths))
    assert texts.facts.tokenizer == str(tokenizer)  # the run still names the user's


def test_two_text_columns_are_a_pair_to_a_sequence_classifier(text_data, tmp_path):
    """sentence1+sentence2 on a classifier was one text of the two run together ("… the
    cat" + "dog sat …" read "catdog", an unknown word): a classifier reads them as a pair, as
    transformers' text-classification example tokenizes them (tokenizer(first, second)), with
    the tokenizer's special tokens around and between them."""
    import datasets
    from tokenizers import Tokenizer, pre_tokenizers, processors
    from tokenizers import models as tokenizer_models
    from transformers import PreTrainedTokenizerFast

    from tests.conftest import WORDS, words

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3,
             **{w: i + 4 for i, w in enumerate(WORDS)}}
    model = Tokenizer(tokenizer_models.WordLevel(vocab, unk_token="[UNK]"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    model.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer = tmp_path / "tokenizer"
    PreTrainedTokenizerFast(tokenizer_object=model, pad_token="[PAD]", unk_token="[UNK]",
                            cls_token="[CLS]", sep_token="[SEP]").save_pretrained(tokenizer)
    pairs = tmp_path / "pairs.jsonl"
    datasets.Dataset.from_dict({"sentence1": [words(n, n) for n in (3, 5, 2, 4)],
                                "sentence2": [words(n, n + 1) for n in (6, 1, 2, 3)],
                                "label": [0, 1, 0, 1]}).to_json(str(pairs))
    options = on(text_data, model="tiny", dataset=str(pairs), tokenizer=str(tokenizer),
                 text_column="sentence1+sentence2")
    found = data.tokenized(options, models.resolve("tiny"), progress=False)
    assert sorted(n for n, c in found.lengths.counts for _ in range(c)) == \
        sorted(a + b + 3 for a, b in [(3, 6), (5, 1), (2, 2), (4, 3)])


def test_the_one_column_of_text_is_the_texts_whatever_its_name(text_data, tmp_path):
    """A dataset of texts under another name than "text" ("sentence", as SST-2's; "content")
    and a label was refused ("has no column of a usual name"): its one column of text is the
    texts, as transformers' language-modelling example takes the column it finds."""
    import datasets

    from tests.conftest import words

    lengths = (4, 7, 2, 5)
    rows = tmp_path / "sentences.jsonl"
    datasets.Dataset.from_dict({"idx": [0, 1, 2, 3],
                                "sentence": [words(n, n) for n in lengths],
                                "label": [0, 1, 0, 1]}).to_json(str(rows))
    found = data.tokenized(on(text_data, dataset=str(rows)), models.resolve("tiny-llama"),
                           progress=False)
    assert found.facts.text_column == "sentence"
    assert sorted(n for n, c in found.lengths.counts for _ in range(c)) == sorted(lengths)


def test_a_file_of_another_encoding_or_of_mixed_values_is_refused_in_words(text_data, tmp_path):
    """A latin-1 CSV file said Python's "'utf-8' codec can't decode byte 0xe9 in position 3:
    invalid continuation byte"; a JSON-lines column of text and numbers "holds json", a type
    the user never wrote."""
    latin = tmp_path / "latin.csv"
    latin.write_bytes("text,label\ncafé au lait,1\nthe cat,0\n".encode("latin-1"))
    field, message = _refused(on(text_data, dataset=str(latin)))
    assert field == "dataset" and message.startswith("dataset: '")
    assert message.endswith("' is not UTF-8 text (a byte 0xe9: another encoding, latin-1 or "
                            "cp1252 perhaps): datasets reads UTF-8; save it as UTF-8")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"text": "the cat"}\n{"text": 5}\n{"text": "a dog"}\n{"text": "far"}\n')
    field, message = _refused(on(text_data, dataset=str(mixed)))
    if field == "dataset":  # an older datasets (the floor, 2.19) refuses the file as it reads it
        assert "cannot be read as json: JSON parse error: Column(/text) changed from string to " \
            "number in row 1" in message, message
    else:
        assert field == "text_column" and "holds values of several kinds (text beside " \
            "numbers, lists or objects), not text" in message, message


def test_json_lines_named_csv_is_refused_by_its_suffix(text_data, tmp_path):
    """JSON lines in a file named .csv were read as CSV: "has no column of a usual name … (its
    columns are {"text":"the cat", label:0})", the user left to make sense of it."""
    named = tmp_path / "texts.csv"
    named.write_text(text_data.lines.read_text())
    field, message = _refused(on(text_data, dataset=str(named)))
    assert field == "dataset" and message.endswith(
        "' holds JSON, not CSV (its first line begins with a JSON object): datasets reads a "
        "file by its suffix; name it .jsonl")


def test_splits_of_different_formats_are_refused_in_anatomys_words(text_data, tmp_path):
    """train.jsonl beside test.parquet in one folder was datasets' own line: "cannot be read as
    its files: Couldn't infer the same data file format for all splits. Got
    {NamedSplit('train'): ('json', {}), NamedSplit('test'): ('parquet', {})}"."""
    import datasets

    rows = datasets.Dataset.from_json(str(text_data.lines))
    folder = tmp_path / "splits"
    (folder / "data").mkdir(parents=True)
    rows.to_json(str(folder / "data" / "train.jsonl"))
    rows.to_parquet(str(folder / "data" / "test.parquet"))
    field, message = _refused(on(text_data, dataset=str(folder)))
    assert field == "dataset" and message == (
        f"dataset: the folder {str(folder)!r} holds its splits in different formats (json: "
        "data/train.jsonl; parquet: data/test.parquet), and datasets reads a folder's splits "
        "in one format: save them in one, or give one split's file")
    (folder / "data" / "test.parquet").unlink()
    rows.to_json(str(folder / "data" / "test.jsonl"))
    assert validate(on(text_data, dataset=str(folder)), gpu_count=0) == {}


def test_a_folder_of_data_files_is_read_once(text_data, tmp_path, monkeypatch):
    """Its files were listed by one builder (to see what datasets would leave out) and read by
    another that load_dataset built again: on a folder of 400 shards of 200,000 lines, 0.3 to
    0.5 s more for each run and each prediction."""
    import datasets
    import datasets.load

    built = []
    build = datasets.load.load_dataset_builder

    def counted(*args, **kwargs):
        built.append(args[0] if args else kwargs.get("path"))
        return build(*args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset_builder", counted)
    monkeypatch.setattr(datasets.load, "load_dataset_builder", counted)
    folder = tmp_path / "shards"
    folder.mkdir()
    rows = datasets.Dataset.from_json(str(text_data.lines))
    for index in range(2):
        rows.shard(2, index).to_json(str(folder / f"train-{index:05d}-of-00002.jsonl"))
    options, texts = data.prepared(on(text_data, dataset=str(folder), batch_size=2),
                                   progress=False)
    assert built == [str(folder)]
    assert options.dataset_size == len(text_data.lengths)

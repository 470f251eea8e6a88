"""A user's dataset and its tokenizer: found, checked and tokenized once into token arrays that the
training reads (engine/dataset.py's `TextDataset`) and whose lengths the prediction reads.

A dataset is a folder saved with `save_to_disk` (a Dataset or a DatasetDict), a JSON-lines, CSV or
Parquet file, or a Hub id in the local cache, read with datasets' own loaders (`load_from_disk`,
`load_dataset`) and its tokenizer with transformers' (`AutoTokenizer.from_pretrained`), both
offline: the Hub is never reached. The fast tokenizer tokenizes the texts in batches (a progress
bar on a terminal) into anatomy's cache folder, keyed by all that makes the tokens (the data's
own fingerprint, the tokenizer's definition, where texts are cut), so the worker, a second run
and a second prediction read them without tokenizing again.

Whatever cannot be used is refused in one line naming its run option (`DataError`), before
anything starts. Imports datasets and transformers inside its functions only.
"""

from __future__ import annotations

import errno
import hashlib
import inspect
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from anatomy.analysis import dummy_data, models
from anatomy.analysis.cache import CACHE_ENV, cache_dir
from anatomy.analysis.lengths import MAX_LENGTH, Lengths
from anatomy.analysis.models import CAUSAL_LM, SEQUENCE_CLASSIFICATION, ModelSpec
from anatomy.store import RunFacts, TrainingData

# The files of text load_dataset reads, by suffix: the builder that reads them and its arguments.
# JSON (lines, or an array of objects), CSV and TSV, Parquet, Arrow (a stream, as datasets writes
# it), plain text (a row a line, in the column "text").
DATA_FILES = {".jsonl": ("json", {}), ".ndjson": ("json", {}), ".json": ("json", {}),
              ".csv": ("csv", {}), ".tsv": ("csv", {"sep": "\t"}), ".parquet": ("parquet", {}),
              ".arrow": ("arrow", {}), ".txt": ("text", {})}
# Each of them compressed, as datasets reads it (fsspec's compressions): d.jsonl.gz is JSON lines.
COMPRESSED = (".gz", ".bz2", ".xz")
DATA_FILE_NAMES = f"{', '.join(DATA_FILES)} (or any of them {', '.join(COMPRESSED)})"
DEFAULT_SPLIT = "train"
DEFAULT_COLUMN = "text"
CHAT_COLUMN = "messages"  # a chat dataset's column, taken where there is no DEFAULT_COLUMN
# A prompt-completion dataset's columns (TRL's format), taken where there is neither: each text
# is its prompt followed by its completion, as TRL's SFTTrainer joins them (tokenized as every
# plain text here is: without the end token recent TRL versions append to a completion). Named
# as one column, joined by PAIR_JOIN ("prompt+completion"), as --text-column may name them too.
PAIR_COLUMNS = ("prompt", "completion")
PAIR_JOIN = "+"
TOKENIZE_BATCH = 1000  # texts per call of the fast tokenizer
LAYOUT = 2  # the token arrays' layout (2: the tokenizer kept beside them): another one is
# tokenized again
TOKENIZER_DIR = "tokenizer"  # the run's tokenizer, kept in its tokens' folder
TEXT_TYPES = ("string", "large_string")
OFFLINE = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")


class RunOptions(Protocol):
    """What this module reads of a run's options (options.RunOptions, which checks a dataset
    through this module)."""

    model: str
    dataset: str
    split: str
    text_column: str
    tokenizer: str
    padding: str
    max_length: int
    batch_size: int

    @property
    def world_size(self) -> int: ...

    @property
    def on_dataset(self) -> bool: ...

    def with_texts(self, texts: int) -> RunOptions: ...


class DataError(ValueError):
    """A dataset or tokenizer that cannot be used, in one line that begins with its option."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class Texts(NamedTuple):
    """A dataset's split, its column of texts and the tokenizer, loaded and checked."""

    source: str  # the dataset: an absolute path, or its Hub id
    split: str
    column: str  # as a run stores it: "text", or a prompt-completion pair's "prompt+completion"
    rows: Any  # datasets.Dataset
    tokenizer: Any  # transformers' fast tokenizer
    tokenizer_source: str  # an absolute path, or its Hub id
    # The column holds conversations (a list of messages, each a role and its content), which
    # the tokenizer's chat template makes text of, as TRL's SFTTrainer trains on them.
    chat: bool = False
    # Two columns of text a sequence classifier reads as a pair (sentence1+sentence2), as
    # transformers' text-classification example tokenizes them: tokenizer(first, second), its
    # special tokens around and between them, not one text of the two run together.
    pair: bool = False
    stamp: DataStamp | None = None  # the files it was read from (None: a Hub dataset)

    @property
    def columns(self) -> tuple[str, ...]:
        """The dataset's columns a text is made of, in order: one, or a prompt and completion."""
        return _parts(self.column, self.rows.column_names)

    def of(self, batch: Mapping[str, list]) -> list:
        """A batch of rows' texts: the column's, a prompt's followed by its completion (strings
        joined, conversations one after the other), a conversation as its chat template writes
        it; a pair's as two lists, the first texts and the second."""
        parts = [batch[name] for name in self.columns]
        if self.pair:
            return parts
        joined = [sum(map(_messages, row), start=[]) if self.chat else "".join(row)
                  for row in zip(*parts)] if len(parts) > 1 else parts[0]
        return _chat_texts(self, joined) if self.chat else joined


class Tokenized(NamedTuple):
    """A dataset tokenized: the folder of its token arrays, and what a run stores of it."""

    folder: str
    facts: TrainingData

    @property
    def lengths(self) -> Lengths:
        return Lengths(self.facts.lengths or ())

    def tokenizer(self):
        """The tokenizer that made the tokens, as they were made (its padding token set), from
        their folder: the worker's collator pads with it, though the user's folder changed or
        went once the run started."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(Path(self.folder) / TOKENIZER_DIR),
                                             local_files_only=True)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 80 else f"{text[:40]}…{text[-30:]}")


def _offline() -> None:
    """Datasets and tokenizers from the disk alone: the Hub cannot be reached (datasets reads
    these when it is imported)."""
    for name in OFFLINE:
        os.environ.setdefault(name, "1")


def _quiet(progress: bool) -> None:
    """datasets' own progress bars on a terminal only, and none of its log lines (a file it
    cannot read is said in one line here)."""
    import logging

    _offline()
    import datasets

    datasets.utils.logging.set_verbosity(logging.CRITICAL)
    if progress:
        datasets.enable_progress_bars()
    else:
        datasets.disable_progress_bars()


def _on_terminal() -> bool:
    return sys.stderr is not None and sys.stderr.isatty()


def _stamp(path: Path) -> tuple:
    """What changes when a tokenizer's files do: each file's name, size and time (a folder's
    files two levels down)."""
    if path.is_file():
        stat = path.stat()
        return ((str(path), stat.st_size, stat.st_mtime_ns),)
    found = []
    for entry in sorted(path.glob("*")) + sorted(path.glob("*/*")):
        if entry.is_file():
            stat = entry.stat()
            found.append((str(entry), stat.st_size, stat.st_mtime_ns))
    return tuple(found)


class DataStamp(NamedTuple):
    """A dataset's files as they are at a moment: what tells later that its path holds other
    data. Their names, sizes and modification times, not their bytes: a run reads a saved
    dataset's tables by mapping them, and hashing every byte of gigabytes at each start would
    cost more than the run's own reading; datasets itself tells a local file's change by its
    time (its cache of a file's table is keyed so)."""

    fingerprint: str  # each file's name (under the dataset's path), size and time, hashed
    size: int  # bytes, its files together
    modified: float  # the latest of its files' modification times, seconds since the epoch


def data_stamp(path: Path) -> DataStamp | None:
    """The files a dataset is read from, as they are now: a file itself; a folder saved with
    save_to_disk, its files but datasets' own cache files (cache-….arrow, which a map or a
    filter writes beside its tables); a folder of data files, its data files. Hidden files
    (".x", "__x"), which datasets leaves out, are no part of it. None where there is no data
    (nothing at the path, nothing readable in it)."""
    found: list[tuple[str, int, int]] = []

    def add(name: str, entry: Path) -> None:
        try:
            stat = entry.stat()
        except OSError:  # gone meanwhile, or a broken link: not data
            return
        found.append((name, stat.st_size, stat.st_mtime_ns))

    try:
        if path.is_file():
            add(".", path)
        elif path.is_dir():
            saved = _saved(path)
            for root, folders, names in os.walk(path):  # what it may not list, it leaves out
                folders[:] = sorted(name for name in folders if not _hidden(name))
                for name in sorted(names):
                    entry = Path(root, name)
                    if _hidden(name) or (saved and re.fullmatch(r"cache-.*\.arrow", name)) or \
                            (not saved and data_format(entry) is None):
                        continue
                    add(entry.relative_to(path).as_posix(), entry)
    except OSError:  # a folder it may not enter: reading it says so, in one line
        return None
    if not found:
        return None
    fingerprint = hashlib.sha256(json.dumps(found).encode()).hexdigest()[:16]
    return DataStamp(fingerprint, sum(size for _, size, _ in found),
                     max(0, max(time for *_, time in found)) / 1e9)


class DataChange(NamedTuple):
    """The data at the path a run trained on, no longer what it read."""

    path: str
    then: DataStamp
    now: DataStamp | None  # None: no data there now


def data_change(facts: RunFacts) -> DataChange | None:
    """How the data at the path a run's facts name differs from what the run read; None where
    it is the same, where the run kept no fingerprint (a Hub dataset, a run stored before runs
    kept one, the dummy data), or where it ran on another host (its path is that host's)."""
    data = facts.data
    if data is None or data.fingerprint is None or not data.dataset or \
            facts.host not in (None, socket.gethostname()):
        return None
    now = data_stamp(Path(data.dataset))
    if now is not None and now.fingerprint == data.fingerprint:
        return None
    return DataChange(data.dataset, DataStamp(data.fingerprint, data.file_bytes or 0,
                                              data.modified or 0.0), now)


def _hidden(name: str) -> bool:
    """A file or folder datasets leaves out of a folder's data (".x", "__x")."""
    return name.startswith((".", "__"))


def _is_hub_id(text: str) -> bool:
    """A Hub dataset's id: "name" or "org/name" of letters, digits, '-', '_' and '.'."""
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?", text) is not None


def _path_of(text: str) -> Path | None:
    try:
        path = Path(text).expanduser()
        return path if path.exists() else None
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return None


def missing(text: str) -> DataError | None:
    """The dataset option's error where it names a file or folder that is not there (a Hub id
    is looked for later, in the local cache): said beside any other error, before the data is
    read."""
    if _path_of(text) is None and (data_format(Path(text)) is not None or
                                   text.startswith((".", "/", "~")) or not _is_hub_id(text)):
        return DataError("dataset", f"no such file or folder: {_shown(text)}")
    return None


# --- the dataset ---

def _load(text: str):
    """The dataset an option names, as datasets loads it: (its source, a Dataset or
    DatasetDict, its files' stamp as they were read: None for a Hub dataset)."""
    path = _path_of(text)
    if path is not None:
        # Taken before it is read: files changed meanwhile are told changed since, not missed.
        stamp = data_stamp(path.resolve())
        return str(path.resolve()), _load_path(text, path.resolve(), stamp), stamp
    if (error := missing(text)) is not None:
        raise error
    try:
        return text, _load_hub(text), None
    except Exception:  # noqa: BLE001 - not in the cache, however datasets says it
        raise DataError("dataset", f"{_shown(text)} is no file or folder here, nor a Hub dataset "
                        "in the local cache (the Hub is not reached: no network)") from None


@lru_cache(maxsize=8)
def _load_path(text: str, path: Path, stamp: DataStamp | None):
    import datasets

    unreadable = _unreadable(path)
    if unreadable is not None:
        where = "" if unreadable == path else f": {_shown(str(unreadable.relative_to(path)))}"
        raise DataError("dataset", f"{_shown(text)} cannot be read: permission denied{where}")
    if path.is_dir():
        if _saved(path):
            try:
                return datasets.load_from_disk(str(path))
            except IndexError:  # datasets' own loader finds no table in a split of no rows
                raise DataError("dataset", f"{_shown(text)} holds a split of no rows: no text "
                                "to train on") from None
            except Exception as error:  # noqa: BLE001 - a split's files gone, or not arrow
                raise DataError("dataset", f"{_shown(text)}, saved with save_to_disk, cannot "
                                f"be read: {models.first_line(error)}") from None
        if not _holds_data_files(path):
            raise DataError("dataset", f"the folder {_shown(text)} is no dataset: neither "
                            "saved with save_to_disk (it has no dataset_info.json or "
                            "dataset_dict.json) nor a folder of data files (ending in "
                            f"{DATA_FILE_NAMES})")
        # A folder of data files, as a dataset's repository holds them (train.jsonl and
        # test.jsonl; data/train-00000-of-00002.parquet …): datasets names its splits by them.
        # One builder lists its files (to read them whole) and reads them: load_dataset would
        # build another, listing them again (0.3 s more on a folder of 400 shards).
        builder = _folder_builder(text, path)
        loaded = _built(text, builder)
        return _without_blank_lines(loaded) if _module(builder) == "text" else loaded
    read = data_format(path)
    if read is None:
        raise DataError("dataset", f"{_shown(text)} is not a dataset: a folder saved with "
                        f"save_to_disk or of data files, or a file ending in {DATA_FILE_NAMES}")
    if path.stat().st_size == 0:
        raise DataError("dataset", f"{_shown(text)} is empty: no text to train on")
    builder, arguments = read
    loaded = _load_files(text, builder, builder, data_files=str(path), **arguments)
    # A JSON file named .csv (or .tsv) reads as a table whose header is its first object: the
    # suffix says the format (as datasets reads it), so the suffix is what is wrong.
    header = next(iter(loaded.values())).column_names if builder == "csv" else []
    if header and header[0].lstrip().startswith(("{", "[")):
        raise DataError("dataset", f"{_shown(text)} holds JSON, not {builder.upper()} (its first "
                        "line begins with a JSON object): datasets reads a file by its suffix; "
                        "name it .jsonl")
    if builder == "json":
        field = _rows_field(text, loaded)
        if field is not None:
            loaded = _load_files(text, builder, builder, data_files=str(path), field=field)
    return _without_blank_lines(loaded) if builder == "text" else loaded


def _rows_field(text: str, loaded) -> str | None:
    """The key under which a JSON file of one object holds its rows ({"version": …, "data":
    [{…}, …]}, as SQuAD's files do), as datasets reads it with `field=`: without it the object
    is one row. None where the file holds rows itself; DataError where several keys hold lists
    of rows."""
    rows = next(iter(loaded.values()))
    if rows.num_rows != 1:
        return None
    only = rows[0]
    fields = [name for name, value in only.items() if isinstance(value, list) and value
              and all(isinstance(row, dict) for row in value)]
    if len(fields) > 1:
        raise DataError("dataset", f"{_shown(text)} holds one JSON object with lists of rows "
                        f"under {', '.join(map(_shown, fields))}: give a file of one list of "
                        "rows, or JSON lines")
    return fields[0] if fields else None


def _without_blank_lines(loaded):
    """A plain text file's rows less its blank lines (empty, or spaces alone): they part its
    paragraphs and are no text of their own, as transformers' run_mlm.py reads a file line by
    line. A text of a JSON or CSV file is the user's row, empty or not."""
    return loaded.filter(lambda row: bool(row[DEFAULT_COLUMN].strip()),
                         desc="leaving out blank lines")


def _saved(folder: Path) -> bool:
    """Whether a folder was written by save_to_disk, as datasets tells (`load_from_disk`): a
    DatasetDict's dataset_dict.json, or a Dataset's state.json. Its arrow files are its splits'
    tables, never a folder of data files to read instead where a split cannot be read."""
    return (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()


def _unreadable(path: Path, most: int = 100_000) -> Path | None:
    """The first file or folder under `path` (itself included) this process may not read:
    datasets' loaders skip a folder they cannot list (a DatasetDict's split, a shard's folder)
    and read the rest as the whole. Stops looking after `most` entries."""
    pending, seen = [path], 0
    while pending and seen < most:
        entry = pending.pop()
        seen += 1
        folder = entry.is_dir()
        if not os.access(entry, os.R_OK | (os.X_OK if folder else 0)):
            return entry
        if folder:
            try:
                pending.extend(sorted(entry.iterdir(), reverse=True))
            except OSError:
                return entry
    return None


def data_format(path: Path) -> tuple[str, dict] | None:
    """The builder that reads a data file, and its arguments, by the file's suffix (the one
    under a compression's); None: no data file of text."""
    suffixes = [suffix.lower() for suffix in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSED:
        suffixes.pop()
    return DATA_FILES.get(suffixes[-1]) if suffixes else None


def _folder_builder(text: str, folder: Path):
    """datasets' builder of a folder's data files, as load_dataset makes it; DataError where it
    cannot make one, or would read them in part: it reads the files of one format alone (the
    most of them), and a folder of JSON lines beside CSV files trained on the JSON lines
    without a word. Hidden files (".x", "__x") datasets leaves out, as a user expects."""
    import datasets

    cache = _datasets_cache()
    try:
        builder = datasets.load_dataset_builder(str(folder), cache_dir=cache)
    except Exception as error:  # noqa: BLE001 - whatever the folder holds: one line
        formats = _data_files(folder)
        if len(formats) > 1:  # each split of its own format: datasets takes none of them
            shown = "; ".join(f"{name}: {_few(files)}" for name, files in formats.items())
            raise DataError("dataset", f"the folder {_shown(text)} holds its splits in "
                            f"different formats ({shown}), and datasets reads a folder's "
                            "splits in one format: save them in one, or give one split's "
                            "file") from None
        raise _unread(text, "its files", error, cache) from None
    read = {Path(name) for names in (builder.config.data_files or {}).values()
            for name in names}
    left = [name for files in _data_files(folder).values() for name in files
            if folder / name not in read]
    if left:
        raise DataError("dataset", f"the folder {_shown(text)} holds data files of several "
                        f"formats, and datasets reads those of one ({len(read):,} "
                        f"{_module(builder)} file{'s' if len(read) != 1 else ''}), leaving out "
                        f"{_few(sorted(left), 3)}: give a folder of one format, or one file")
    return builder


def _data_files(folder: Path) -> dict[str, list[str]]:
    """A folder's data files (under it, hidden ones left out, as datasets reads it), by the
    format that reads them (json, csv …), in their names' order."""
    found: dict[str, list[str]] = {}
    for entry in sorted(folder.rglob("*")):
        read = data_format(entry)
        name = entry.relative_to(folder)
        if read is not None and entry.is_file() and not any(map(_hidden, name.parts)):
            found.setdefault(read[0], []).append(str(name))
    return dict(sorted(found.items()))


def _few(names: list[str], most: int = 2) -> str:
    """The first names of a list, and how many more."""
    more = len(names) - most
    return ", ".join(names[:most]) + (f" and {more:,} more" if more > 0 else "")


def _built(text: str, builder):
    """The dataset a builder reads, as load_dataset reads it (its tables written into the
    cache, then mapped; in memory where datasets' IN_MEMORY_MAX_SIZE says so)."""
    from datasets.utils.info_utils import is_small_dataset

    try:
        builder.download_and_prepare()
        return builder.as_dataset(in_memory=is_small_dataset(builder.info.dataset_size))
    except Exception as error:  # noqa: BLE001 - whatever the files hold: one line
        raise _unread(text, "its files", error, _datasets_cache()) from None


def _module(builder) -> str:
    """The builder's format, as datasets names its packaged modules (json, csv, parquet …)."""
    return type(builder).__module__.rsplit(".", 1)[-1]


def _holds_data_files(folder: Path) -> bool:
    """Whether data files lie in `folder` or a folder of it (a repository's data/, train/)."""
    return any(data_format(entry) is not None and entry.is_file()
               for entry in [*folder.glob("*"), *folder.glob("*/*")])


def _load_files(text: str, kind: str, *args, **kwargs):
    """datasets' `load_dataset(*args, **kwargs)` of the user's files (read as `kind`), into
    anatomy's cache folder; whatever they hold that cannot be read, one line."""
    import datasets

    cache = _datasets_cache()
    try:
        return datasets.load_dataset(*args, **kwargs, cache_dir=cache)
    except Exception as error:  # noqa: BLE001 - whatever the files hold: one line
        raise _unread(text, kind, error, cache) from None


def _unread(text: str, kind: str, error: Exception, cache: str | None) -> DataError:
    """Why datasets could not read the user's files (read as `kind`), in one line."""
    cause = error.__cause__ or error.__context__ or error
    if "corresponds to no data" in str(error):  # a CSV file of its header alone
        return DataError("dataset", f"{_shown(text)} holds no rows: no text to train on")
    # The cache's disk, not the files: full as it writes, or too full to start (datasets'
    # own check, an OSError of no errno).
    full = any(isinstance(e, OSError) and (e.errno in (errno.ENOSPC, errno.EDQUOT) or
                                           str(e).startswith("Not enough disk space"))
               for e in (error, cause))
    if full:
        return DataError("dataset", f"{_shown(text)} cannot be read into the cache "
                         f"{cache or 'of datasets'}: no space left on its device "
                         f"({CACHE_ENV} names another folder)")
    encoding = next((e for e in (error, cause) if isinstance(e, UnicodeDecodeError)), None)
    if encoding is not None:  # datasets reads its text files as UTF-8
        byte = encoding.object[encoding.start:encoding.start + 1].hex()
        return DataError("dataset", f"{_shown(text)} is not UTF-8 text (a byte 0x{byte}: "
                         "another encoding, latin-1 or cp1252 perhaps): datasets reads "
                         "UTF-8; save it as UTF-8")
    return DataError("dataset", f"{_shown(text)} cannot be read as {kind}: "
                     f"{models.first_line(cause)}")


def _datasets_cache() -> str | None:
    """Where datasets keeps its tables of the user's files: anatomy's cache (None where the user
    turned it off: datasets' own)."""
    folder = cache_dir()
    return str(_writable(folder, "datasets")) if folder is not None else None


def _writable(folder: Path, name: str) -> Path:
    """`folder`'s sub-folder `name`, made; where it cannot be (a read-only home, a file in its
    place), one in a temporary folder this process removes as it ends: a cache that cannot be
    written is a slower start, not the user's files' fault."""
    try:
        (folder / name).mkdir(parents=True, exist_ok=True)
        return folder / name
    except OSError:
        scratch = Path(_scratch().name) / name
        scratch.mkdir(exist_ok=True)
        return scratch


@lru_cache(maxsize=1)
def _scratch() -> tempfile.TemporaryDirectory:
    """One a process, kept by this cache until the process ends, which removes it."""
    return tempfile.TemporaryDirectory(prefix="anatomy-cache-")


@lru_cache(maxsize=8)
def _load_hub(hub_id: str):
    import datasets

    return datasets.load_dataset(hub_id)


def _split(loaded, text: str, split: str):
    """The split of a DatasetDict that `split` names (empty: train, or its only split); a Dataset
    saved alone is its one split."""
    import datasets

    if isinstance(loaded, datasets.Dataset):
        own = str(loaded.split) if loaded.split is not None else ""
        if split and split != own:
            raise DataError("split", f"{_shown(text)} is a single Dataset, saved without splits: "
                            "leave the split out")
        return own or DEFAULT_SPLIT, loaded
    names = list(loaded)
    if not split:
        if DEFAULT_SPLIT in names or len(names) != 1:
            split = DEFAULT_SPLIT
        else:
            split = names[0]
    if split not in names:
        raise DataError("split", f"{_shown(split)} is not a split of {_shown(text)} (its splits: "
                        f"{', '.join(names) or 'none'})")
    return split, loaded[split]


def _column(rows, text: str, split: str, column: str) -> tuple[str, bool]:
    """The column of texts (a prompt-completion pair's two, joined by PAIR_JOIN) and whether it
    holds conversations (`_conversations`)."""
    names = rows.column_names
    columns = f"({split}: its columns are {', '.join(names) or 'none'})"
    # None named, none of the usual names there: the one column of text, as transformers'
    # language-modelling example takes the column it finds ("sentence", "content", "review").
    texts = [name for name in names if getattr(rows.features[name], "dtype", None) in TEXT_TYPES
             and type(rows.features[name]).__name__ == "Value"]
    if not column:
        column = next((c for c in (DEFAULT_COLUMN, CHAT_COLUMN) if c in names), None) or (
            PAIR_JOIN.join(PAIR_COLUMNS) if set(PAIR_COLUMNS) <= set(names) else "") or (
            texts[0] if len(texts) == 1 else "")
    if not column:  # several columns of text, or none
        usual = ", ".join((DEFAULT_COLUMN, CHAT_COLUMN, PAIR_JOIN.join(PAIR_COLUMNS)))
        which = (f": name the column of texts, or two joined by {PAIR_JOIN} "
                 f"({PAIR_JOIN.join(texts[:2])})") if texts else ", and none of text"
        raise DataError("text_column", f"{_shown(text)} has no column of a usual name ({usual}) "
                        f"nor one column of text alone {columns}{which}")
    parts = _parts(column, names)
    for part in parts:
        if part not in names:
            raise DataError("text_column", f"{_shown(part)} is not a column of {_shown(text)} "
                            f"{columns}")
    kinds = {_one_column(rows, text, part) for part in parts}
    if len(kinds) > 1:
        raise DataError("text_column", f"{_shown(column)} of {_shown(text)} joins text and "
                        "conversations: a prompt and its completion are both text, or both "
                        "conversations")
    return column, kinds.pop()


def _parts(column: str, names: list[str]) -> tuple[str, ...]:
    """The columns a text column's name stands for: itself, or the two it joins by PAIR_JOIN
    (where no column has that whole name)."""
    return tuple(column.split(PAIR_JOIN)) if PAIR_JOIN in column and column not in names \
        else (column,)


def _one_column(rows, text: str, column: str) -> bool:
    """Whether a column of texts holds conversations; DataError where it holds neither text nor
    conversations, or a row of none."""
    feature = rows.features[column]
    dtype = getattr(feature, "dtype", None)
    missing = rows.data.column(column).null_count
    if rows.num_rows and missing == rows.num_rows:  # typed by its reader: a CSV's blanks are floats
        raise DataError("text_column", f"{_shown(column)} of {_shown(text)} holds no text: each of"
                        f" its {rows.num_rows:,} rows is empty")
    chat = _conversations(feature)
    if not chat and (type(feature).__name__ != "Value" or dtype not in TEXT_TYPES):
        kind = dtype if type(feature).__name__ == "Value" else type(feature).__name__.lower()
        # datasets 5 types a JSON column of values of several kinds as Json
        kind = "values of several kinds (text beside numbers, lists or objects)" \
            if kind == "json" else kind
        raise DataError("text_column", f"{_shown(column)} of {_shown(text)} holds {kind}, not "
                        "text, nor conversations (a list of messages, each a role and its "
                        "content)")
    if missing:
        raise DataError("text_column", f"{missing:,} of the {rows.num_rows:,} rows of "
                        f"{_shown(column)} hold no {'conversation' if chat else 'text'} (null):"
                        " filter them out first (Dataset.filter)")
    return chat


def _conversations(feature) -> bool:
    """Whether a column's type is a chat dataset's (a "messages" column): a list of messages,
    each a role and its content as text. datasets 4 types it List({...}); 2 and 3 a list of one
    dict, or Sequence({...})."""
    inner = feature[0] if isinstance(feature, list) and len(feature) == 1 else \
        getattr(feature, "feature", None) if type(feature).__name__ in (
            "List", "LargeList", "Sequence") else None
    return isinstance(inner, dict) and all(
        type(inner.get(key)).__name__ == "Value" and inner[key].dtype in TEXT_TYPES
        for key in ("role", "content"))


def _chat_texts(texts: Texts, conversations: list) -> list[str]:
    """Each conversation as its chat template writes it (a Sequence's dict of lists made a list
    of messages again)."""
    made = []
    for conversation in conversations:
        try:
            made.append(texts.tokenizer.apply_chat_template(_messages(conversation),
                                                            tokenize=False))
        except Exception as error:  # noqa: BLE001 - the template's own words (jinja), one line
            raise DataError("text_column", f"{_shown(texts.column)} holds a conversation the "
                            f"tokenizer's chat template refuses: {models.first_line(error)}"
                            ) from None
    return made


def _messages(conversation) -> list:
    """A conversation as a list of messages (datasets' Sequence gives a dict of lists)."""
    if isinstance(conversation, dict):
        return [dict(zip(conversation, message)) for message in zip(*conversation.values())]
    return list(conversation)


# --- the tokenizer ---

def _tokenizer(text: str):
    """(the tokenizer, its source): transformers' fast tokenizer from a folder or the local cache,
    with a padding token (its end token where it has none, as causal LMs' are padded)."""
    _offline()
    path = _path_of(text)
    source = str(path.resolve()) if path is not None else text
    if path is None and (text.startswith((".", "/", "~")) or not _is_hub_id(text)):
        raise DataError("tokenizer", f"no such folder: {_shown(text)}")
    stamp = _stamp(Path(source)) if path is not None else ()
    try:
        tokenizer = _load_tokenizer(source, stamp)
    except OSError as error:
        if path is None:
            raise DataError("tokenizer", f"{_shown(text)} is no folder here, nor a tokenizer in "
                            "the local Hugging Face cache (the Hub is not reached: no network)"
                            ) from None
        raise _no_tokenizer(text, path, error) from None
    except Exception as error:  # noqa: BLE001 - a folder of something else: one line
        raise _no_tokenizer(text, path, error) from None
    # transformers makes a tokenizer of no vocabulary from a model's config alone (a model's
    # folder given as the tokenizer): every text would be no token.
    if len(tokenizer) <= len(set(tokenizer.all_special_ids)):
        raise _no_tokenizer(text, path, None)
    if not getattr(tokenizer, "is_fast", False):
        raise DataError("tokenizer", f"{_shown(text)} has no fast tokenizer (a tokenizer.json): "
                        "anatomy tokenizes with the fast one")
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise DataError("tokenizer", f"{_shown(text)} has neither a padding token nor an "
                            "end token to pad with")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, source


def _no_tokenizer(text: str, path: Path | None, error: BaseException | None) -> DataError:
    """A folder that holds no tokenizer, in one line: where it lacks the file a fast tokenizer is
    saved in, that (transformers' own words, a list over several lines, would be cut)."""
    if path is not None and path.is_dir() and not (path / "tokenizer.json").is_file():
        return DataError("tokenizer", f"{_shown(text)} holds no tokenizer: no tokenizer.json "
                         "(a fast tokenizer as save_pretrained writes it)")
    words = models.first_line(error) if error is not None else "it has no vocabulary"
    return DataError("tokenizer", f"{_shown(text)} holds no tokenizer transformers can load "
                     f"({words.rstrip(',:;. ')})")


@lru_cache(maxsize=8)
def _load_tokenizer(source: str, stamp: tuple):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source, local_files_only=True)


def load_tokenizer(source: str):
    """The tokenizer a user's folder or the local cache holds, checked as a run's is."""
    return _tokenizer(source)[0]


# --- what a run trains on ---

def open_texts(options: RunOptions, progress: bool | None = None) -> Texts:
    """The options' dataset split, column and tokenizer, loaded and checked; DataError if one
    cannot be used. `progress`: datasets' bars while it reads a file (None: on a terminal)."""
    _quiet(_on_terminal() if progress is None else progress)
    source, loaded, stamp = _load(options.dataset.strip())
    split, rows = _split(loaded, options.dataset, options.split.strip())
    column, chat = _column(rows, options.dataset, split, options.text_column.strip())
    tokenizer, tokenizer_source = _tokenizer(options.tokenizer.strip())
    if chat and not tokenizer.chat_template:
        raise DataError("tokenizer", f"{_shown(options.tokenizer.strip())} has no chat template:"
                        f" {_shown(column)} holds conversations, which a chat template makes "
                        "text of (a tokenizer saved with one: chat_template.jinja)")
    return Texts(source, split, column, rows, tokenizer, tokenizer_source, chat, stamp=stamp)


def text_model_error(spec: ModelSpec) -> str | None:
    """Why a model cannot train on a dataset's texts: only text models do (a causal LM, a sequence
    classifier), whose one input is a sequence of token ids."""
    if spec.task not in (CAUSAL_LM, SEQUENCE_CLASSIFICATION):
        return (f"{spec.display_name} is a model for {spec.task}: a dataset's texts train text "
                "models (a causal LM or a sequence classifier)")
    sample = dummy_data.sample(spec, 8)
    names = [name for name, _ in sample.tensors]
    ids = dict(sample.tensors).get("input_ids")
    if ids is None or ids.shape != (8,) or ids.last is not None or \
            set(names) - {"input_ids", "labels"}:
        return (f"{spec.display_name} takes more than a sequence of token ids ({sample.words}): "
                "a dataset's texts train text models that take one")
    return None


def cut_at(options: RunOptions, spec: ModelSpec) -> int | None:
    """Where texts are cut: the option's length, else the model's longest sequence (None:
    nowhere)."""
    return options.max_length or spec.max_positions


def problems(options: RunOptions, spec: ModelSpec) -> dict[str, str]:
    """What stops a run on these options' dataset, by option: the model, the data, the
    tokenizer, their sizes together. Empty when it may train."""
    try:
        wrong = text_model_error(spec)
    except models.ModelError as error:
        return {"model": str(error)}
    if wrong:
        return {"dataset": f"dataset: {wrong}"}
    positions = spec.max_positions
    if positions and options.max_length > positions:
        return {"max_length": f"max_length: {options.max_length} is out of range for "
                              f"{spec.display_name}: 1 to {positions}"}
    if options.padding == MAX_LENGTH and not cut_at(options, spec):
        return {"max_length": f"max_length: padding to max_length needs one, and "
                              f"{spec.display_name} names no longest sequence: give --max-length"}
    try:
        texts = open_texts(options)
    except DataError as error:
        return {error.field: str(error)}
    rows = texts.rows.num_rows
    if rows == 0:  # the split the user named, else the dataset (its only split) is at fault
        field = "split" if options.split.strip() else "dataset"
        return {field: f"{field}: {_shown(texts.split)} of {_shown(options.dataset)} is empty: no "
                       "text to train on"}
    need = options.batch_size * max(1, options.world_size)
    if rows < need:
        processes = max(1, options.world_size)
        return {"dataset": f"dataset: {_shown(options.dataset)} ({texts.split}) holds {rows:,} "
                           f"text{'s' if rows != 1 else ''}, fewer than one batch of "
                           f"{options.batch_size} for each of {processes} training "
                           f"process{'es' if processes != 1 else ''}: a smaller batch size "
                           "trains on it"}
    vocabulary = spec.vocab_size
    if vocabulary and len(texts.tokenizer) > vocabulary:
        return {"tokenizer": f"tokenizer: its vocabulary ({len(texts.tokenizer):,} tokens) is "
                             f"larger than {spec.display_name}'s ({vocabulary:,}): its ids "
                             "would index past the model's embeddings"}
    return {}


def _inputs(tokenizer, spec: ModelSpec) -> tuple[str, ...]:
    """The tensors the tokenizer gives besides the token ids that the model's forward takes (the
    Trainer drops a dataset's other columns)."""
    given = tokenizer(["a"])
    forward = inspect.signature(models.head_class(spec).forward).parameters
    return tuple(name for name in given if name != "input_ids" and name in forward)


def _key(texts: Texts, cut: int | None, inputs: tuple[str, ...]) -> str:
    tokenizer = texts.tokenizer
    made_of = {"layout": LAYOUT, "source": texts.source, "split": texts.split,
               "column": texts.column, "fingerprint": texts.rows._fingerprint,
               "rows": texts.rows.num_rows, "cut": cut, "inputs": list(inputs),
               "tokenizer": hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()
                                           ).hexdigest(),
               "special": {k: str(v) for k, v in tokenizer.special_tokens_map.items()},
               "truncation_side": tokenizer.truncation_side,
               "chat_template": tokenizer.chat_template if texts.chat else None,
               "pair": texts.pair}
    return hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()[:32]


def _tokens_dir() -> Path:
    folder = cache_dir()
    return _writable(folder if folder is not None else Path(tempfile.gettempdir()) / "anatomy",
                     "tokens")


def tokenized(options: RunOptions, spec: ModelSpec, progress: bool | None = None) -> Tokenized:
    """The options' dataset tokenized (from the cache where it was before): its token arrays'
    folder and what a run stores of it. `progress`: a bar while it tokenizes (None: on a
    terminal). DataError if the data or the tokenizer cannot be used."""
    progress = _on_terminal() if progress is None else progress
    texts = open_texts(options, progress)
    if spec.task == SEQUENCE_CLASSIFICATION and len(texts.columns) == 2 and not texts.chat:
        texts = texts._replace(pair=True)
    cut = cut_at(options, spec)
    inputs = _inputs(texts.tokenizer, spec)
    folder = _tokens_dir() / _key(texts, cut, inputs)
    if not (folder / "offsets.npy").is_file():
        _tokenize(texts, cut, inputs, folder, progress)
    offsets = np.load(folder / "offsets.npy", mmap_mode="r")
    lengths, counts = np.unique(np.diff(offsets), return_counts=True)
    # A batch drawn from empty texts alone is a tensor of no length, which no model takes;
    # fewer of them than a batch are always padded beside a text that has tokens.
    empty = int(counts[0]) if len(lengths) and lengths[0] == 0 else 0
    if empty >= options.batch_size:
        raise DataError("text_column", f"{empty:,} of the {int(counts.sum()):,} texts of "
                        f"{_shown(texts.column)} are no token (empty, or spaces alone): a batch "
                        f"of {options.batch_size} of them would hold nothing to train on; "
                        "filter them out first (Dataset.filter)")
    facts = TrainingData.of(
        dataset=texts.source, split=texts.split, text_column=texts.column,
        tokenizer=texts.tokenizer_source, padding=options.padding, max_length=cut,
        inputs=inputs, padding_side=texts.tokenizer.padding_side,
        lengths=tuple((int(n), int(c)) for n, c in zip(lengths, counts)),
        **({} if texts.stamp is None else {"fingerprint": texts.stamp.fingerprint,
                                           "file_bytes": texts.stamp.size,
                                           "modified": texts.stamp.modified}))
    return Tokenized(str(folder), facts)


def _tokenize(texts: Texts, cut: int | None, inputs: tuple[str, ...], folder: Path,
              progress: bool) -> None:
    """The texts through the fast tokenizer in batches, into `folder` whole or not at all: the
    token ids of every text one after another (`input_ids.npy`), where each begins
    (`offsets.npy`), and each other input the model takes (token_type_ids) alike."""
    from tqdm import tqdm

    rows = texts.rows.select_columns(list(texts.columns))
    arrays: dict[str, list[np.ndarray]] = {name: [] for name in ("input_ids", *inputs)
                                           if name != "attention_mask"}
    ends = [np.zeros(1, dtype=np.int64)]
    total = 0
    # A conversation's template writes its special tokens itself (its BOS, each turn's
    # markers): the tokenizer adds none, as TRL's SFTTrainer tokenizes it.
    chat = texts.chat
    with tqdm(total=rows.num_rows, unit=" texts", desc="tokenizing", disable=not progress,
              file=sys.stderr) as bar:
        for batch in rows.iter(batch_size=TOKENIZE_BATCH):
            given = texts.of(batch) if texts.pair else [texts.of(batch)]
            try:
                encoded = texts.tokenizer(*given, truncation=cut is not None, max_length=cut,
                                          add_special_tokens=not chat)
            except (TypeError, ValueError) as error:
                raise DataError("text_column", f"{_shown(texts.column)} holds a value the "
                                f"tokenizer cannot read: {models.first_line(error)}") from None
            for name, parts in arrays.items():
                parts.append(np.fromiter((t for ids in encoded[name] for t in ids),
                                         dtype=np.int32))
            sizes = np.fromiter((len(ids) for ids in encoded["input_ids"]), dtype=np.int64)
            ends.append(total + np.cumsum(sizes))
            total += int(sizes.sum())
            bar.update(len(sizes))
    making = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        making = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".making-"))
        for name, parts in arrays.items():
            np.save(making / f"{name}.npy", np.concatenate(parts))
        texts.tokenizer.save_pretrained(str(making / TOKENIZER_DIR))
        np.save(making / "offsets.npy", np.concatenate(ends))  # last: the folder is whole
        try:
            os.replace(making, folder)
        except OSError:  # made meanwhile by another process: theirs is the same
            pass
    except OSError as error:  # a full disk (numpy's short write has no errno)
        raise DataError("dataset", f"its tokens cannot be written into {folder.parent}: "
                        f"{error.strerror or 'written in part only: its disk is full'} "
                        f"({CACHE_ENV} names another folder)") from None
    finally:
        if making is not None:
            shutil.rmtree(making, ignore_errors=True)


def prepared(options: RunOptions, progress: bool | None = None
             ) -> tuple[RunOptions, Tokenized | None]:
    """A run on a dataset: its texts tokenized before anything starts (`progress`: a bar, on a
    terminal where None), and the options as the run stores them (`with_texts`); the options
    alone on the dummy data. DataError if the data or the tokenizer cannot be used."""
    if not options.on_dataset:
        return options, None
    try:
        spec = models.resolve(options.model)
    except models.ModelError as error:
        raise DataError("model", str(error).removeprefix("model: ")) from None
    found = tokenized(options, spec, progress)
    return options.with_texts(found.lengths.texts), found

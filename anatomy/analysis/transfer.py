"""Moving runs between stores: a self-describing JSON file (with a schema version) and CSV samples
(a chart as a standalone HTML page is views/export.py's).

An import is judged whole before anything is written: a wrong, truncated or foreign file is
refused with a message that says what is wrong and where, and an accepted one lands in one
transaction, so nothing half-imported stays.
"""

from __future__ import annotations

import csv
import io
import json
import math
import socket
from dataclasses import asdict, replace
from typing import Any

from anatomy.analysis.options import FIELDS, RunOptions, shown, validate
from anatomy.analysis.report import report
from anatomy.store import (
    SPANS,
    STATUSES,
    Message,
    PhaseSpan,
    RunRecord,
    RunRow,
    Sample,
    Step,
    Store,
)

SCHEMA = "anatomy.runs"
SCHEMA_VERSION = 1
SAMPLE_COLUMNS = ("t", "gpu", "used", "reserved", "total", "util")

MAX_MEMORY = 2**50  # a pebibyte: far above any device, so a larger figure is a broken file
MAX_INTEGER = 2**63 - 1  # SQLite's INTEGER
MAX_SECONDS = 1e9  # since the run's start: three decades
MAX_EPOCH = 1e11  # wall clock, seconds since 1970: the year 5138
BACKENDS = ("nvml", "cpu-rss")
MEMORY_APIS = ("v2", "v1", "rss")
# Version 1's options. An option added later is absent from older files: the run ran with its
# default, so it takes the default; one of these missing means a broken file. The model was
# called "preset" until other models came: either name will do.
V1_OPTIONS = ("batch_size", "seq_len", "dataset_size", "epochs", "max_steps", "precision",
              "gradient_checkpointing", "grad_accum", "optim", "seed", "sample_rate", "gpu")
MODEL_KEYS = ("model", "preset")
# An exported run's machine is not this one: its GPU index is judged against the most GPUs a
# machine may have, and fp16 is accepted as it would be on a GPU.
ANY_GPU_COUNT = FIELDS["gpu"].high + 1


def export_runs(store: Store, run_ids: list[int]) -> dict:
    """Every recorded row of the runs, plus the report (what `show` prints) for the reader's sake."""
    runs = []
    for run_id in run_ids:
        run = store.run(run_id)
        if run is None:
            raise KeyError(f"run {run_id} is not in {store.path}")
        runs.append({
            "run": {**asdict(run), "tags": list(run.tags)},
            "report": report(store, run_id, run).to_dict(),
            # Every rank's (issue 12); a row says its rank only where it is not 0.
            "phases": [_ranked(p._asdict()) for p in store.phases(run_id, None)],
            "samples": [list(s) for s in store.samples(run_id)],
            "steps": [_ranked(s._asdict()) for s in store.steps(run_id, None)],
            "messages": [m._asdict() for m in store.messages(run_id)],
        })
    # Where these runs come from: an import records it with each run and knows them again.
    origin = {"store": store.identity(), "host": socket.gethostname(), "path": str(store.path)}
    return {"schema": SCHEMA, "version": SCHEMA_VERSION, "sample_columns": list(SAMPLE_COLUMNS),
            "origin": origin, "runs": runs}


def _ranked(row: dict) -> dict:
    """A phase or step as exported: "rank" only for ranks other than 0 (a file of one process
    reads as before)."""
    return row if row.get("rank") else {k: v for k, v in row.items() if k != "rank"}


def samples_csv(store: Store, run_ids: list[int]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(("run_id", *SAMPLE_COLUMNS))
    for run_id in run_ids:
        if store.run(run_id) is None:
            raise KeyError(f"run {run_id} is not in {store.path}")
        for sample in store.samples(run_id):
            writer.writerow((run_id, *sample))
    return out.getvalue()


# --- import ---

class ImportRefused(ValueError):
    """A file that cannot be imported; the message says what is wrong and where."""


class AlreadyImported(ImportRefused):
    """Runs of the file are in the store already (imported before, or recorded there): `found`
    maps each one's place in the file to its run here. An import with `copy=True` takes them
    again."""

    def __init__(self, found: dict[int, int], origins: dict[int, dict], recorded_here: set[int]):
        self.found = found
        parts = [f"runs[{i}] ({_origin_words(origins[i])}) is "
                 + (f"run {n} of this store already" if i in recorded_here
                    else f"already imported as run {n}") for i, n in found.items()]
        super().__init__("; ".join(parts))


def _origin_words(origin: dict) -> str:
    words = f"run {origin['run']}" if origin.get("run") is not None else "a run"
    if origin.get("path"):
        words += f" of {origin['path']}"
    if origin.get("host"):
        words += f" on {origin['host']}"
    return words


class _Unreadable:
    """A JSON number that is no finite float (1e400, NaN, Infinity): kept as written, so the
    message quotes the file and no value check ever passes it."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _json_float(text: str) -> float | _Unreadable:
    value = float(text)
    return value if math.isfinite(value) else _Unreadable(text)


def _refuse(where: str, what: str) -> ImportRefused:
    return ImportRefused(f"{where}: {what}")


def _stops_early(text: str) -> bool:
    """Whether the text ends inside a string or with a bracket still open: a cut file, whatever
    the token the cut landed in (the parser's own message then names that token)."""
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
    return in_string or depth > 0


def _parse(data: dict | bytes | str) -> Any:
    if isinstance(data, dict):
        return data
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError as error:
            raise ImportRefused(f"the file is not UTF-8 text (byte {error.start}): "
                                "not an anatomy export") from None
    if not data.strip():
        raise ImportRefused("the file is empty")
    try:
        return json.loads(data, parse_float=_json_float, parse_constant=_Unreadable)
    except json.JSONDecodeError as error:
        where = f"line {error.lineno}, column {error.colno} (character {error.pos} of {len(data)})"
        if _stops_early(data):
            raise ImportRefused(f"the file is truncated: its JSON stops early, at {where}") from None
        raise ImportRefused(f"the file is not valid JSON: {error.msg} at {where}") from None
    except ValueError as error:  # an integer of more digits than Python converts
        raise ImportRefused(f"the file holds a number it cannot read: {error}") from None
    except RecursionError:
        raise ImportRefused("the file's JSON is nested too deeply to be an anatomy export") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _int(value: Any, where: str, low: int = 0, high: int = MAX_INTEGER,
         optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if not _is_int(value) or not low <= value <= high:
        raise _refuse(where, f"must be a whole number from {low} to {high}, got {shown(value)}")
    return value


def _memory(value: Any, where: str, optional: bool = True) -> int | None:
    if value is None and optional:
        return None
    if not _is_int(value) or not 0 <= value <= MAX_MEMORY:
        raise _refuse(where, "memory must be a whole number of bytes from 0 to 2**50, got "
                      + shown(value))
    return value


def _seconds(value: Any, where: str, high: float = MAX_SECONDS, optional: bool = False
             ) -> float | None:
    if value is None and optional:
        return None
    if not _is_number(value) or not 0 <= value <= high:
        raise _refuse(where, f"time must be a finite number of seconds from 0 to {high:,.0f}, got "
                      + shown(value))
    return value


def _encodable(text: str, where: str) -> str:
    """Text SQLite can store: UTF-8, which a lone surrogate ("\\ud800" in JSON) is not."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise _refuse(where, f"holds {text[error.start]!r}, half of a UTF-16 pair, which is not "
                      "text that can be stored") from None
    return text


def _text(value: Any, where: str, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _refuse(where, f"must be text, got {shown(value)}")
    return _encodable(value, where)


def _number(value: Any, where: str, optional: bool = True) -> float | None:
    """A finite number from 0 (a time, a rate, a loss's size is not bounded below: see _steps)."""
    if value is None and optional:
        return None
    if not _is_number(value) or value < 0:
        raise _refuse(where, f"must be a finite number from 0, got {shown(value)}")
    return value


def _choice(value: Any, where: str, choices: tuple, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if value not in choices:
        raise _refuse(where, f"{shown(value)} is not one of {', '.join(map(str, choices))}")
    return value


def _object(value: Any, where: str, required: tuple[str, ...] = ()) -> dict:
    if not isinstance(value, dict):
        raise _refuse(where, f"must be a JSON object, got {type(value).__name__} {shown(value)}")
    missing = [key for key in required if key not in value]
    if missing:
        raise _refuse(where, f"is missing {', '.join(repr(k) for k in missing)}")
    return value


def _array(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise _refuse(where, f"must be a JSON array, got {type(value).__name__} {shown(value)}")
    return value


def _plain(value: Any, where: str) -> Any:
    """Free-form JSON (environment, summary): any shape, but only numbers SQLite and JSON keep."""
    if isinstance(value, dict):
        for key, item in value.items():
            _encodable(key, f"{where} (a key)")
            _plain(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _plain(item, f"{where}[{index}]")
    elif _is_int(value):
        _int(value, where, -MAX_INTEGER - 1)
    elif isinstance(value, float) or isinstance(value, _Unreadable):
        if not _is_number(value):
            raise _refuse(where, f"must be a finite number, got {shown(value)}")
    elif isinstance(value, str):
        _encodable(value, where)
    elif not (value is None or isinstance(value, bool)):
        raise _refuse(where, f"is not JSON: {shown(value)}")
    return value


def _known(value: Any, where: str, checks: dict) -> dict:
    """An object whose known keys are checked by `checks` (key -> check(value, where)) and whose
    other keys (a newer anatomy's) are free-form JSON."""
    value = _object(value, where)
    for key, item in value.items():
        check = checks.get(key)
        if check is None:
            _encodable(key, f"{where} (a key)")
            _plain(item, f"{where}.{key}")
        else:
            check(item, f"{where}.{key}")
    return value


def _count(value: Any, where: str) -> int | None:
    return _int(value, where, optional=True)


# What the report and the pages read from a run's environment and summary, checked by type: an
# imported run draws as a recorded one does, or is refused.
ENVIRONMENT = {
    **{key: _text for key in ("driver", "cuda_driver", "gpu_name", "gpu_uuid", "why_no_gpu",
                              "torch", "torch_cuda", "transformers", "device_name", "weights",
                              "attention")},
    "gpu_count": lambda value, where: _int(value, where, 0, FIELDS["gpu"].high + 1, optional=True),
    "gpu_total": _memory, "ram_total": _memory, "parameters": _count,
}


def _moments(value: Any, where: str) -> dict | None:
    """The allocator at named moments of a step: bytes by name."""
    if value is None:
        return None
    for key, item in _object(value, where).items():
        _encodable(key, f"{where} (a key)")
        _memory(item, f"{where}.{key}", optional=False)
    return value


COMPONENTS = {
    **{key: _memory for key in ("weights", "activations", "gradients", "optimizer_states",
                                "temporary", "allocator_cache", "peak_allocated", "peak_reserved",
                                "context", "non_torch", "peak")},
    "moments": _moments, "steps_measured": _count,
}


def _class_totals(value: Any, where: str) -> dict:
    value = _object(value, where, ("time_us", "flops", "count"))
    extra = [key for key in value if key not in ("time_us", "flops", "count")]
    if extra:
        raise _refuse(where, f"unknown key {shown(extra[0])}: totals are time_us, flops, count")
    _number(value["time_us"], f"{where}.time_us", optional=False)
    _int(value["flops"], f"{where}.flops")
    _int(value["count"], f"{where}.count")
    return value


def _operators(value: Any, where: str) -> list:
    for index, operator in enumerate(_array(value, where)):
        here = f"{where}[{index}]"
        _known(_object(operator, here, ("name", "class", "time_us", "flops", "count")), here, {
            "name": lambda v, w: _text(v, w, optional=False),
            "class": lambda v, w: _text(v, w, optional=False),
            "time_us": lambda v, w: _number(v, w, optional=False),
            "flops": _int, "count": _int})
    return value


def _operations(value: Any, where: str) -> dict | None:
    if value is None:
        return None
    value = _object(value, where, ("device", "time_source", "steps", "classes", "operators",
                                   "optimizer"))
    return _known(value, where, {
        "device": lambda v, w: _text(v, w, optional=False),
        "time_source": lambda v, w: _text(v, w, optional=False),
        "steps": _int,
        "classes": lambda v, w: {_encodable(k, f"{w} (a key)"): _class_totals(item, f"{w}.{k}")
                                 for k, item in _object(v, w).items()},
        "operators": _operators,
        "optimizer": _class_totals,
    })


def _loss(value: Any, where: str) -> float | None:
    if value is not None and not _is_number(value):
        raise _refuse(where, f"must be a finite number, got {shown(value)}")
    return value


SUMMARY = {
    "time_s": _number, "samples_per_second": _number, "steps": _count, "loss": _loss,
    "components": lambda value, where: None if value is None else _known(value, where, COMPONENTS),
    "operations": _operations,
    # Several processes: ranks 1… components, by rank (rank 0's are "components").
    "rank_components": lambda value, where: {
        str(_int(int(k) if str(k).isdigit() else k, f"{where}.{k}", high=MAX_RANK)):
            _known(v, f"{where}.{k}", COMPONENTS) for k, v in _object(value, where).items()},
}
MAX_RANK = 65_535


def _options(value: Any, where: str) -> dict:
    value = _object(value, where, V1_OPTIONS)
    if not any(key in value for key in MODEL_KEYS):
        raise _refuse(where, "has no model (\"model\" or \"preset\")")
    options = RunOptions.from_dict(value)
    # The model's config may have stayed on the machine the run came from: judged as text only.
    errors = validate(options, ANY_GPU_COUNT, resolve_model=False, here=False)
    if errors:
        raise _refuse(where, next(iter(errors.values())))
    _plain(value, where)  # the options this anatomy does not know
    return {**value, **options.to_dict()}




def _tags(value: Any, where: str) -> list[str]:
    for index, tag in enumerate(_array(value, where)):
        if not isinstance(tag, str) or not tag.strip() or "," in tag:
            raise _refuse(f"{where}[{index}]", f"a tag is text without commas, got {shown(tag)}")
        _encodable(tag, f"{where}[{index}]")
    return value


def _origin(value: Any, where: str) -> dict | None:
    """Where a run that was itself imported first came from (kept through re-exports)."""
    if value is None:
        return None
    return _known(value, where, {
        "store": _text, "host": _text, "path": _text, "run": _count,
        "created_at": lambda v, w: _seconds(v, w, MAX_EPOCH, optional=True)})


def _run_row(value: Any, where: str) -> RunRow:
    run = _object(value, where, ("created_at", "status", "options", "backend", "gpu"))
    options = _options(run["options"], f"{where}.options")
    return RunRow(
        id=0,  # the store gives it a new one
        name=_text(run.get("name"), f"{where}.name"),
        created_at=_seconds(run["created_at"], f"{where}.created_at", MAX_EPOCH),
        ended_at=_seconds(run.get("ended_at"), f"{where}.ended_at", MAX_EPOCH, optional=True),
        status=_choice(run["status"], f"{where}.status", STATUSES),
        preset=options["model"],
        options=options,
        environment=_known(run.get("environment", {}), f"{where}.environment", ENVIRONMENT),
        backend=_choice(run["backend"], f"{where}.backend", BACKENDS),
        memory_api=_choice(run.get("memory_api"), f"{where}.memory_api", MEMORY_APIS,
                           optional=True),
        gpu=_int(run["gpu"], f"{where}.gpu", 0, FIELDS["gpu"].high),
        summary=_known(run.get("summary", {}), f"{where}.summary", SUMMARY),
        error=_text(run.get("error"), f"{where}.error"),
        samples_sent=_int(run.get("samples_sent"), f"{where}.samples_sent", optional=True),
        tags=tuple(_tags(run.get("tags", []), f"{where}.tags")),
        sweep=_text(run.get("sweep"), f"{where}.sweep"),
        worker_pid=None,
        source=_plain(_object(run.get("source", {}), f"{where}.source"), f"{where}.source"),
        origin=_origin(run.get("origin"), f"{where}.origin"),
    )


def _samples(value: Any, where: str) -> list[Sample]:
    rows = []
    for j, sample in enumerate(_array(value, where)):
        here = f"{where}[{j}]"
        if not isinstance(sample, list) or len(sample) != len(SAMPLE_COLUMNS):
            raise _refuse(here, f"a sample is [{', '.join(SAMPLE_COLUMNS)}], got {shown(sample)}")
        t, gpu, used, reserved, total, util = sample
        rows.append(Sample(
            _seconds(t, f"{here}[0]"), _int(gpu, f"{here}[1]", 0, FIELDS["gpu"].high),
            _memory(used, f"{here}[2]", optional=False), _memory(reserved, f"{here}[3]"),
            _memory(total, f"{here}[4]"), _int(util, f"{here}[5]", 0, 100, optional=True)))
    return rows


def _phases(value: Any, where: str) -> list[PhaseSpan]:
    rows = []
    for j, phase in enumerate(_array(value, where)):
        here = f"{where}[{j}]"
        phase = _object(phase, here, ("name", "start_s", "end_s"))
        name = _choice(phase["name"], f"{here}.name", SPANS)
        rank = _int(phase.get("rank", 0), f"{here}.rank", high=MAX_RANK)
        if any(row.name == name and row.rank == rank for row in rows):
            raise _refuse(f"{here}.name", f"the {name} phase appears twice")
        start = _seconds(phase["start_s"], f"{here}.start_s")
        end = _seconds(phase["end_s"], f"{here}.end_s", optional=True)
        if end is not None and end < start:
            raise _refuse(f"{here}.end_s", f"the phase ends ({end}) before it starts ({start})")
        rows.append(PhaseSpan(name, start, end, rank))
    return rows


def _steps(value: Any, where: str) -> list[Step]:
    rows = []
    for j, step in enumerate(_array(value, where)):
        here = f"{where}[{j}]"
        step = _object(step, here, ("t", "step"))
        loss = _loss(step.get("loss"), f"{here}.loss")
        rows.append(Step(_seconds(step["t"], f"{here}.t"), _int(step["step"], f"{here}.step"),
                         _int(step.get("total"), f"{here}.total", optional=True), loss,
                         _memory(step.get("allocated"), f"{here}.allocated"),
                         _memory(step.get("reserved"), f"{here}.reserved"),
                         _int(step.get("rank", 0), f"{here}.rank", high=MAX_RANK)))
    return rows


def _messages(value: Any, where: str) -> list[Message]:
    rows = []
    for j, note in enumerate(_array(value, where)):
        here = f"{where}[{j}]"
        note = _object(note, here, ("t", "level", "text"))
        rows.append(Message(_seconds(note["t"], f"{here}.t"),
                            _text(note["level"], f"{here}.level", optional=False),
                            _text(note["text"], f"{here}.text", optional=False)))
    return rows


def _record(value: Any, where: str, source: dict) -> RunRecord:
    entry = _object(value, where, ("run", "phases", "samples"))
    run = _run_row(entry["run"], f"{where}.run")
    if run.origin is None:  # recorded where it was exported: that store is its origin
        run_id = _int(entry["run"].get("id"), f"{where}.run.id", 1, optional=True)
        run = replace(run, origin={**source, "run": run_id, "created_at": run.created_at})
    record = RunRecord(
        run=run,
        samples=_samples(entry["samples"], f"{where}.samples"),
        phases=_phases(entry["phases"], f"{where}.phases"),
        steps=_steps(entry.get("steps", []), f"{where}.steps"),
        messages=_messages(entry.get("messages", []), f"{where}.messages"),
    )
    if record.run.status == "running":
        # Exported mid-run: here nothing will ever finish it. It ends where its recording ends.
        last = max((sample.t for sample in record.samples), default=0.0)
        record = replace(
            record,
            run=replace(record.run, status="stopped", error=(
                "still running on its machine when it was exported: imported as stopped, with "
                "what had been recorded by then")),
            phases=[p if p.end_s is not None else p._replace(end_s=max(p.start_s, last))
                    for p in record.phases])
    return record


def _header(data: Any) -> list:
    if not isinstance(data, dict):
        raise ImportRefused(f"not an anatomy export: the file holds a JSON {type(data).__name__},"
                            f" not an object with \"schema\": \"{SCHEMA}\"")
    if "schema" not in data:
        keys = ", ".join(repr(k) for k in list(data)[:6]) or "none"
        raise ImportRefused(f"not an anatomy export: there is no \"schema\" (its keys: {keys})")
    if data["schema"] != SCHEMA:
        raise _refuse("schema", f"{shown(data['schema'])} is not an anatomy export "
                      f"(expected {SCHEMA!r})")
    version = data.get("version")
    if version != SCHEMA_VERSION or not _is_int(version):
        newer = (" (a newer anatomy wrote it: upgrade this one)"
                 if _is_int(version) and version > SCHEMA_VERSION else "")
        raise _refuse("version", f"the file is schema version {shown(version)}; this anatomy "
                      f"reads version {SCHEMA_VERSION}{newer}")
    if data.get("sample_columns") != list(SAMPLE_COLUMNS):
        raise _refuse("sample_columns", f"expected {list(SAMPLE_COLUMNS)}, got "
                      f"{shown(data.get('sample_columns'))}")
    runs = _array(data.get("runs"), "runs")
    if not runs:
        raise _refuse("runs", "the file holds no run")
    return runs


def _source(data: dict) -> dict:
    """The exporting store (files written before exports said so: unknown)."""
    origin = data.get("origin")
    if origin is None:
        return {"store": None, "host": None, "path": None}
    origin = _known(origin, "origin", {"store": _text, "host": _text, "path": _text})
    return {key: origin.get(key) for key in ("store", "host", "path")}


def read_export(data: dict | bytes | str) -> list[RunRecord]:
    """The runs of an export file, checked and ready for `Store.add_runs`; ImportRefused if any
    part of the file is wrong. Each run's `origin` says where it was first recorded."""
    data = _parse(data)
    runs = _header(data)
    source = _source(data)
    return [_record(entry, f"runs[{i}]", source) for i, entry in enumerate(runs)]


def _same_run(a: dict, b: dict) -> bool:
    """Two origins name the same run: its store and id there, or (files that do not name their
    store) its id and the moment it was created."""
    if a.get("run") is None or a.get("run") != b.get("run"):
        return False
    if a.get("store") and b.get("store"):
        return a["store"] == b["store"]
    return a.get("created_at") == b.get("created_at")


def already_here(store: Store, records: list[RunRecord]) -> tuple[dict[int, int], set[int]]:
    """The records whose run this store holds already, by their place in the list, with the run
    here; and which of them were recorded here in the first place (the others were imported)."""
    identity = store.identity()
    known = [(run.id, run.origin) for run in store.runs() if run.origin]
    found: dict[int, int] = {}
    recorded_here: set[int] = set()
    for index, record in enumerate(records):
        origin = record.run.origin
        if origin.get("store") and origin["store"] == identity and origin.get("run") is not None:
            here = store.run(origin["run"])
            if here is not None and here.created_at == origin.get("created_at"):
                found[index] = here.id
                recorded_here.add(index)
                continue
        match = next((run_id for run_id, other in known if _same_run(origin, other)), None)
        if match is not None:
            found[index] = match
    return found, recorded_here


def import_runs(store: Store, data: dict | bytes | str, copy: bool = False) -> list[int]:
    """Every run of an export file, under new ids, in one transaction: all of them or none.
    AlreadyImported when one of them is here already, unless `copy` asks for them again."""
    records = read_export(data)
    if not copy:
        found, recorded_here = already_here(store, records)
        for index, record in enumerate(records):  # the same run twice in one file
            earlier = next((j for j in range(index) if _same_run(records[j].run.origin,
                                                                  record.run.origin)), None)
            if earlier is not None and index not in found:
                raise _refuse(f"runs[{index}]", f"the same run as runs[{earlier}]")
        if found:
            raise AlreadyImported(found, {i: records[i].run.origin for i in found}, recorded_here)
    return store.add_runs(records)

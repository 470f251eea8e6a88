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
from dataclasses import replace
from typing import Any, BinaryIO

from anatomy.analysis.options import (
    FIELDS,
    NAMES,
    InvalidOptions,
    ReportedOptions,
    RunOptions,
    validated,
)
from anatomy.analysis.report import report
from anatomy.store import (
    HOST_STRIDE,
    Message,
    Origin,
    PhaseSpan,
    RunFacts,
    RunRecord,
    RunRow,
    RunSource,
    Sample,
    Step,
    Store,
    TrainingSummary,
)
from anatomy.store.checks import (
    MAX_EPOCH,
    MAX_RANK,
    InvalidValue,
    Unreadable,
    array,
    finite,
    is_int,
    is_tag,
    member,
    memory,
    obj,
    plain,
    seconds,
    shown,
    text,
    whole,
)
from anatomy.vocabulary import Backend, MemoryApi, Phase, Status

SCHEMA = "anatomy.runs"
SCHEMA_VERSION = 1
SAMPLE_COLUMNS = ("t", "gpu", "used", "reserved", "total", "util")

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
    with store.snapshot():  # one moment's rows: a delete or a recording under way cuts none
        return _export_runs(store, run_ids)


def _export_runs(store: Store, run_ids: list[int]) -> dict:
    runs = []
    for run_id in run_ids:
        run = store.run(run_id)
        if run is None:
            raise KeyError(f"run {run_id} is not in {store.path}")
        runs.append({
            "run": run.to_dict(),
            "report": report(store, run_id, run).to_dict(),
            # Every rank's phases; a row says its rank only where it is not 0.
            "phases": [_ranked(_exported_phase(p)) for p in store.phases(run_id, None)],
            "samples": [list(s) for s in store.samples(run_id)],
            "steps": [_ranked(_exported_step(s)) for s in store.steps(run_id, None)],
            "messages": [m._asdict() for m in store.messages(run_id)],
        })
    # Where these runs come from: an import records it with each run and knows them again.
    origin = {"store": store.identity(), "host": socket.gethostname(), "path": str(store.path)}
    return {"schema": SCHEMA, "version": SCHEMA_VERSION, "sample_columns": list(SAMPLE_COLUMNS),
            "origin": origin, "runs": runs}


def _exported_phase(phase: PhaseSpan) -> dict:
    """A phase as its import takes it: never ending before it began (a store written before
    close_phases knew it holds such a watched command's "process" phase)."""
    if phase.end_s is not None and phase.end_s < phase.start_s:
        phase = phase._replace(end_s=phase.start_s)
    return phase._asdict()


def _exported_step(step: Step) -> dict:
    """A step as its import takes it: a loss that is no number (a diverged training reports
    inf; SQLite keeps it, JSON has no word for it) is unknown, as NaN is once stored."""
    if step.loss is not None and not math.isfinite(step.loss):
        step = step._replace(loss=None)
    return step._asdict()


def _ranked(row: dict) -> dict:
    """A phase or step as exported: "rank" only for ranks other than 0, a step's "seq_len" only
    where it was read (a file of one process of anatomy's own reads as before)."""
    return {k: v for k, v in row.items() if not (k == "rank" and not v)
            and not (k == "seq_len" and v is None)}


def samples_csv(store: Store, run_ids: list[int]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_HEADER.split(","))
    with store.snapshot():  # one moment's rows: a delete under way cuts none
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

    def __init__(self, found: dict[int, int], origins: dict[int, Origin], recorded_here: set[int]):
        self.found = found
        parts = [f"runs[{i}] ({origins[i].words()}) is "
                 + (f"run {n} of this store already" if i in recorded_here
                    else f"already imported as run {n}") for i, n in found.items()]
        super().__init__("; ".join(parts))


def _json_float(number: str) -> float | Unreadable:
    value = float(number)
    return value if math.isfinite(value) else Unreadable(number)


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


CSV_HEADER = ",".join(("run_id", *SAMPLE_COLUMNS))


def _other_export(text: str) -> str | None:
    """Which of export's other formats the text is, if it is one (their bracket-less text read
    as a cut JSON file: "truncated", for the HTML page), or a store given for its export."""
    if text.startswith(SQLITE_HEADER):
        return "an SQLite database (a store of runs? export them with --store FILE)"
    start = text.lstrip()[:100].lower()
    if start.startswith(("<!doctype html", "<html")):
        return "an HTML page (the export for viewing, --format html)"
    if start.startswith(CSV_HEADER):
        return "the samples as CSV (--format csv)"
    return None


SQLITE_HEADER = "SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
HEAD_BYTES = 64 * 1024  # what is read of a file before the rest: enough to know it is no export


def read_file(stream: BinaryIO) -> bytes:
    """An export file's bytes, read whole only where its start can begin one (a JSON object):
    `import /dev/zero` filled memory until the kernel killed it, and a weights file given by
    mistake was read whole, gigabytes, before being refused. ImportRefused otherwise, in the
    words the whole file would have had."""
    head = stream.read(HEAD_BYTES)
    try:
        text = head.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        if error.start < len(head) - 3:  # no character cut at the head's end: not UTF-8
            _parse(head)
        text = head[:error.start].decode("utf-8-sig")
    if text.lstrip()[:1] not in ("", "{", "["):  # an export is an object; a list says what it is
        _parse(text)
    return head + stream.read()


def _parse(data: dict | bytes | str) -> Any:
    if isinstance(data, dict):
        return data
    if isinstance(data, bytes) and data.startswith(SQLITE_HEADER.encode()):
        data = SQLITE_HEADER  # binary past its header: said as what it is, not as bad UTF-8
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError as error:
            raise ImportRefused(f"the file is not UTF-8 text (byte {error.start}): "
                                "not an anatomy export") from None
    if not data.strip():
        raise ImportRefused("the file is empty")
    other = _other_export(data)
    if other:
        raise ImportRefused(f"it is {other}; import reads the JSON export "
                            "(anatomy export RUN_ID --format json)")
    try:
        return json.loads(data, parse_float=_json_float, parse_constant=Unreadable)
    except json.JSONDecodeError as error:
        where = f"line {error.lineno}, column {error.colno} (character {error.pos} of {len(data)})"
        if _stops_early(data):
            raise ImportRefused(f"the file is truncated: its JSON stops early, at {where}") from None
        raise ImportRefused(f"the file is not valid JSON: {error.msg} at {where}") from None
    except ValueError as error:  # an integer of more digits than Python converts
        raise ImportRefused(f"the file holds a number it cannot read: {error}") from None
    except RecursionError:
        raise ImportRefused("the file's JSON is nested too deeply to be an anatomy export") from None


def _options(value: Any, where: str) -> tuple[dict, RunOptions]:
    """The options as they will be stored (those this anatomy does not know kept), and read."""
    value = obj(value, where, V1_OPTIONS)
    if not any(key in value for key in MODEL_KEYS):
        raise InvalidValue(where, "has no model (\"model\" or \"preset\")")
    known = {k: v for k, v in value.items() if k in NAMES or k in MODEL_KEYS}
    if "model" in known:  # both names: the newer one's
        known.pop("preset", None)
    try:
        # The model's config may have stayed on the machine the run came from: judged as text
        # only.
        options = validated(known, ANY_GPU_COUNT, resolve_model=False, here=False).options
    except InvalidOptions as error:
        raise InvalidValue(where, next(iter(error.errors.values()))) from None
    plain(value, where)  # the options this anatomy does not know
    return {**value, **options.to_dict()}, options


def _reported(value: Any, where: str) -> dict:
    """A user's training's options (a script, the callback, a watched command): only what it
    reported, as it reported it, kept so (ReportedOptions: readers take them as known, never a
    default filled in). Their types are checked, not anatomy's own ranges; what this anatomy
    does not know is kept as JSON."""
    value = obj(value, where)
    ReportedOptions.read(value, where)
    plain(value, where)
    return value


def _tags(value: Any, where: str) -> list[str]:
    for index, tag in enumerate(array(value, where)):
        if not is_tag(tag):
            raise InvalidValue(f"{where}[{index}]", f"a tag is text without commas, got {shown(tag)}")
        text(tag, f"{where}[{index}]")
    return value


def _required(kind, value: Any, where: str):
    """One of the enum `kind`'s members, never None."""
    if value is None:
        raise InvalidValue(where, f"None is not one of {', '.join(kind.values())}")
    return member(kind)(value, where)


def _run_row(value: Any, where: str) -> RunRow:
    """The run's row, its facts built as the types they are: a value of the wrong type is
    refused here, with its place, and no reader ever sees it."""
    run = obj(value, where, ("created_at", "status", "options", "backend", "gpu"))
    source = RunSource.from_dict(run.get("source", {}), f"{where}.source")
    if source.by_user:
        options, preset = _reported(run["options"], f"{where}.options"), text(
            run.get("preset"), f"{where}.preset")
    else:
        options, known = _options(run["options"], f"{where}.options")
        preset = known.model
    origin = run.get("origin")
    return RunRow(
        id=0,  # the store gives it a new one
        name=text(run.get("name"), f"{where}.name"),
        created_at=seconds(run["created_at"], f"{where}.created_at", MAX_EPOCH),
        ended_at=seconds(run.get("ended_at"), f"{where}.ended_at", MAX_EPOCH, optional=True),
        status=_required(Status, run["status"], f"{where}.status"),
        preset=preset,
        options=options,
        environment=RunFacts.from_dict(run.get("environment", {}), f"{where}.environment"),
        backend=_required(Backend, run["backend"], f"{where}.backend"),
        memory_api=member(MemoryApi)(run.get("memory_api"), f"{where}.memory_api"),
        gpu=whole(run["gpu"], f"{where}.gpu", 0, FIELDS["gpu"].high),
        summary=TrainingSummary.from_dict(run.get("summary", {}), f"{where}.summary"),
        error=text(run.get("error"), f"{where}.error"),
        samples_sent=whole(run.get("samples_sent"), f"{where}.samples_sent", optional=True),
        tags=tuple(_tags(run.get("tags", []), f"{where}.tags")),
        sweep=text(run.get("sweep"), f"{where}.sweep"),
        worker_pid=None,
        source=source,
        origin=None if origin is None else Origin.from_dict(origin, f"{where}.origin"),
    )


def _device(value: Any, where: str, on_gpu: bool) -> int:
    """A sample's device as the recording keys it (`store.device_key`): on the run's host a GPU's
    NVML index, or on the CPU 0 for the training's tree and 1 + a rank's local rank for that
    rank's own processes; on the k-th host of a run across hosts, k × HOST_STRIDE plus that."""
    high = FIELDS["gpu"].high if on_gpu else HOST_STRIDE - 1
    if not is_int(value) or not 0 <= value < (MAX_RANK + 1) * HOST_STRIDE \
            or value % HOST_STRIDE > high:
        raise InvalidValue(where, f"must be a device's number: its index from 0 to {high}, on the"
                           f" k-th host of a run k × {HOST_STRIDE} + its index, got {shown(value)}")
    return value


def _samples(value: Any, where: str, on_gpu: bool) -> list[Sample]:
    rows = []
    for j, sample in enumerate(array(value, where)):
        here = f"{where}[{j}]"
        if not isinstance(sample, list) or len(sample) != len(SAMPLE_COLUMNS):
            raise InvalidValue(here, f"a sample is [{', '.join(SAMPLE_COLUMNS)}], got {shown(sample)}")
        t, gpu, used, reserved, total, util = sample
        rows.append(Sample(
            seconds(t, f"{here}[0]"), _device(gpu, f"{here}[1]", on_gpu),
            memory(used, f"{here}[2]", optional=False), memory(reserved, f"{here}[3]"),
            memory(total, f"{here}[4]"), whole(util, f"{here}[5]", 0, 100, optional=True)))
    return rows


def _phases(value: Any, where: str, by_user: bool) -> list[PhaseSpan]:
    """The phases: anatomy's own, or for a user's training any it named (`run.phase("eval")`,
    stored and shown as given: its export was refused by every import)."""
    rows = []
    for j, phase in enumerate(array(value, where)):
        here = f"{where}[{j}]"
        phase = obj(phase, here, ("name", "start_s", "end_s"))
        name = (_phase_name(phase["name"], f"{here}.name") if by_user
                else _required(Phase, phase["name"], f"{here}.name"))
        # A name may come again (training, eval, training; `train()` twice): each occurrence
        # is a phase of its own, as the recording stored it.
        rank = whole(phase.get("rank", 0), f"{here}.rank", high=MAX_RANK)
        start = seconds(phase["start_s"], f"{here}.start_s")
        end = seconds(phase["end_s"], f"{here}.end_s", optional=True)
        if end is not None and end < start:
            raise InvalidValue(f"{here}.end_s", f"the phase ends ({end}) before it starts ({start})")
        rows.append(PhaseSpan(name, start, end, rank))
    return rows


def _phase_name(value: Any, where: str) -> Phase | str:
    """A phase of a user's training: anatomy's, or one the script named."""
    name = text(value, where, optional=False)
    if not name.strip():
        raise InvalidValue(where, "a phase is named, got ''")
    return Phase._value2member_map_.get(name, name)


def _steps(value: Any, where: str) -> list[Step]:
    rows = []
    for j, step in enumerate(array(value, where)):
        here = f"{where}[{j}]"
        step = obj(step, here, ("t", "step"))
        loss = finite(step.get("loss"), f"{here}.loss")
        rows.append(Step(seconds(step["t"], f"{here}.t"), whole(step["step"], f"{here}.step"),
                         whole(step.get("total"), f"{here}.total", optional=True), loss,
                         memory(step.get("allocated"), f"{here}.allocated"),
                         memory(step.get("reserved"), f"{here}.reserved"),
                         whole(step.get("rank", 0), f"{here}.rank", high=MAX_RANK),
                         whole(step.get("seq_len"), f"{here}.seq_len", optional=True)))
    return rows


def _messages(value: Any, where: str) -> list[Message]:
    rows = []
    for j, note in enumerate(array(value, where)):
        here = f"{where}[{j}]"
        note = obj(note, here, ("t", "level", "text"))
        rows.append(Message(seconds(note["t"], f"{here}.t"),
                            text(note["level"], f"{here}.level", optional=False),
                            text(note["text"], f"{here}.text", optional=False)))
    return rows


def _record(value: Any, where: str, source: Origin) -> RunRecord:
    entry = obj(value, where, ("run", "phases", "samples"))
    run = _run_row(entry["run"], f"{where}.run")
    if run.origin is None:  # recorded where it was exported: that store is its origin
        run_id = whole(entry["run"].get("id"), f"{where}.run.id", 1, optional=True)
        run = replace(run, origin=Origin.from_dict({**source.to_dict(), "run": run_id,
                                                    "created_at": run.created_at}))
    record = RunRecord(
        run=run,
        samples=_samples(entry["samples"], f"{where}.samples", run.backend == Backend.NVML),
        phases=_phases(entry["phases"], f"{where}.phases", run.source.by_user),
        steps=_steps(entry.get("steps", []), f"{where}.steps"),
        messages=_messages(entry.get("messages", []), f"{where}.messages"),
    )
    if record.run.status == Status.RUNNING:
        # Exported mid-run: here nothing will ever finish it. It ends where its recording ends.
        record = replace(record, run=replace(record.run, status=Status.STOPPED, error=(
            "still running on its machine when it was exported: imported as stopped, with "
            "what had been recorded by then")))
    # Every imported run is over: a phase left open (a run that ended without a word) ends at
    # its last sample.
    last = max((sample.t for sample in record.samples), default=0.0)
    return replace(record, phases=[p if p.end_s is not None else p._replace(end_s=max(p.start_s, last))
                                   for p in record.phases])


def _header(data: Any) -> list:
    if not isinstance(data, dict):
        raise ImportRefused(f"not an anatomy export: the file holds a JSON {type(data).__name__},"
                            f" not an object with \"schema\": \"{SCHEMA}\"")
    if "schema" not in data:
        keys = ", ".join(repr(k) for k in list(data)[:6]) or "none"
        raise ImportRefused(f"not an anatomy export: there is no \"schema\" (its keys: {keys})")
    if data["schema"] != SCHEMA:
        raise InvalidValue("schema", f"{shown(data['schema'])} is not an anatomy export "
                      f"(expected {SCHEMA!r})")
    version = data.get("version")
    if version != SCHEMA_VERSION or not is_int(version):
        newer = (" (a newer anatomy wrote it: upgrade this one)"
                 if is_int(version) and version > SCHEMA_VERSION else "")
        raise InvalidValue("version", f"the file is schema version {shown(version)}; this anatomy "
                      f"reads version {SCHEMA_VERSION}{newer}")
    if data.get("sample_columns") != list(SAMPLE_COLUMNS):
        raise InvalidValue("sample_columns", f"expected {list(SAMPLE_COLUMNS)}, got "
                      f"{shown(data.get('sample_columns'))}")
    runs = array(data.get("runs"), "runs")
    if not runs:
        raise InvalidValue("runs", "the file holds no run")
    return runs


def _source(data: dict) -> Origin:
    """The exporting store (files written before exports said so: unknown)."""
    origin = data.get("origin")
    known = Origin() if origin is None else Origin.from_dict(origin, "origin")
    return Origin.from_dict({"store": known.store, "host": known.host, "path": known.path})


def read_export(data: dict | bytes | str) -> list[RunRecord]:
    """The runs of an export file, checked and ready for `Store.add_runs`; ImportRefused if any
    part of the file is wrong. Each run's `origin` says where it was first recorded."""
    data = _parse(data)
    try:
        runs = _header(data)
        source = _source(data)
        return [_record(entry, f"runs[{i}]", source) for i, entry in enumerate(runs)]
    except InvalidValue as error:
        raise ImportRefused(str(error)) from None


def already_here(store: Store, records: list[RunRecord]) -> tuple[dict[int, int], set[int]]:
    """The records whose run this store holds already, by their place in the list, with the run
    here; and which of them were recorded here in the first place (the others were imported)."""
    identity = store.identity()
    known = [(run.id, run.origin) for run in store.runs() if run.origin]
    found: dict[int, int] = {}
    recorded_here: set[int] = set()
    for index, record in enumerate(records):
        origin = record.run.origin
        if origin.store and origin.store == identity and origin.run is not None:
            here = store.run(origin.run)
            if here is not None and here.created_at == origin.created_at:
                found[index] = here.id
                recorded_here.add(index)
                continue
        match = next((run_id for run_id, other in known if origin.same_run(other)), None)
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
            earlier = next((j for j in range(index)
                            if records[j].run.origin.same_run(record.run.origin)), None)
            if earlier is not None and index not in found:
                raise ImportRefused(f"runs[{index}]: the same run as runs[{earlier}]")
        if found:
            raise AlreadyImported(found, {i: records[i].run.origin for i in found}, recorded_here)
    return store.add_runs(records)

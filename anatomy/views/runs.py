"""The Runs page's table, computed without Streamlit: its columns, what tells runs apart first."""

from __future__ import annotations

from anatomy.analysis.models import display_name
from anatomy.analysis.report import IMPORTED, RunListing
from anatomy.units import in_mib
from anatomy.views.text import data_name
from anatomy.vocabulary import Status

PEAK = in_mib("Peak")  # the figure the list is for

COLUMNS = {  # RunListing field: the table's heading. What tells runs apart comes first.
    "id": "Run", "name": "Name", "model": "Model", "dataset": "Data", "device": "Device", "status": "Status",
    "peak_mb": PEAK, "samples_per_second": "Samples/s", "time_s": "Time (s)",
    "processes": "Processes", "batch_size": "Batch", "seq_len": "Seq len",
    "precision": "Precision", "lora_rank": "LoRA rank", "gradient_checkpointing": "Checkpointing",
    "grad_accum": "Accum", "optim": "Optimizer", "source": "Started by", "tags": "Tags",
    "created": "Started",
}


def _cell(row: RunListing, key: str):
    value = getattr(row, key)
    if key == "source":  # "anatomy": its own worker (the form, `anatomy run`, a sweep)
        return (value or "anatomy") + (f" ({IMPORTED})" if row.imported else "")
    if key == "model" and value:
        return display_name(value)  # a config file's path by its name, as the pickers say it
    if key == "dataset":  # as `anatomy runs` names it; none (not ""): the dummy data
        return data_name(value) or None
    return value.removeprefix("NVIDIA ") if key == "device" else value  # a narrow column


def table(rows: list[RunListing]) -> list[dict]:
    """One dict a run, keyed by the table's headings, in COLUMNS' order."""
    return [{heading: _cell(row, key) for key, heading in COLUMNS.items()} for row in rows]


def plotted(rows: list[RunListing]) -> list[RunListing]:
    """The runs of the list that peak memory against speed can place: completed ones with both
    figures (anatomy's or a Trainer's; a watched command reports no speed). A stopped run has
    both too, of the steps it took: the first, the setup's, can make it look slow, and its
    peak may be short of a whole run's; the caption says "a point per completed run"."""
    return [r for r in rows if r.status == Status.COMPLETED and r.peak_mb is not None
            and r.samples_per_second is not None]


NOTHING_PLOTTED = ("No run of this list has both a peak and a speed to place here (samples a "
                   "second: what a completed run of anatomy's own or of a Trainer reports).")


# Which run (its id, its name, its model: what a user tells runs apart by), how it ended (which
# runs failed: a list of sweep points is read for that first) and the figure the list is for:
# shown at any width, the name and the model in at most WIDEST pixels each, which hold a model
# class's name ("BertForSequenceClassification") and a name of 20 characters (a longer one is cut
# in the table; the heading below it says it whole).
ALWAYS = ("Run", "Name", "Model", "Status", PEAK)
WIDEST = {"Name": 180, "Model": 250}


# What a run measured or when it ran: these differ between any two runs, and tell nothing of
# why (a LoRA run beside a full one showed its speed and time, its LoRA rank hidden).
OUTCOMES = ("Samples/s", "Time (s)", "Started")


def by_use(table: list[dict]) -> list[str]:
    """The table's headings in the order they earn a place where not all fit: the run and its
    peak, then the options that tell the runs listed apart, then the outcomes that differ, then
    those every run shares, then those no run has a value in (each group in COLUMNS' order)."""
    headings = [h for h in COLUMNS.values() if h not in ALWAYS]
    empty = [h for h in headings if all(row[h] is None for row in table)]
    differ = [h for h in headings if h not in empty and len({repr(row[h]) for row in table}) > 1]
    same = [h for h in headings if h not in empty and h not in differ]
    options = [h for h in differ if h not in OUTCOMES]
    return [*ALWAYS, *options, *[h for h in differ if h in OUTCOMES], *same, *empty]

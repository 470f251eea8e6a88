"""What every test shares: the tiers, each test's own store, the tiny run, the seeded runs.

tests/unit/ runs in this process only: a test there that starts a process fails (it belongs in
tests/e2e/). tests/e2e/ starts real processes (the worker, the sampler, the CLI, Streamlit,
Chromium), or traces whole models for seconds a case (the prediction's proofs); its tests carry
the `e2e` marker. At the end of the session no process that a test started may be left
(`_no_process_outlives_the_session`)."""

from __future__ import annotations

import functools
import json
import multiprocessing.process
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import psutil
import pynvml
import pytest

from anatomy.analysis import transfer
from anatomy.analysis.machine import Machine
from anatomy.analysis.options import FIELDS, RunOptions
from anatomy.analysis.transformers_index import index_once
from anatomy.engine import nvml
from anatomy.engine.devices import machine
from anatomy.engine.manager import LOCK_DIR_ENV, RunManager
from anatomy.store import STORE_ENV, Message, PhaseMark, Sample, Step, Store
from tests.fake_nvml import FakePynvml
from tests.helpers import within

# pytest rewrites each test module's asserts as it imports it, and keeps the result beside it
# (__pycache__/*-pytest-*.pyc) only where Python may write bytecode: where PYTHONDONTWRITEBYTECODE
# is set (this machine, CI) every session and every pytest-xdist worker rewrote all ~90 modules
# again (a third of collecting tests/unit: about 5 CPU s a worker). The rewritten modules are
# cached; what the session's own processes write stays as their environment says.
sys.dont_write_bytecode = False

# Before anything loads transformers: its model folders' index from the session's cache folder
# (set below, before the tests are collected), as anatomy's own processes have it.
index_once()

PROJECT = Path(__file__).resolve().parent.parent
TIERS = ("unit", "e2e")
# Set in every process the session starts (they inherit it): how the last check finds them.
SESSION_ENV = "ANATOMY_TEST_SESSION"

# The smallest real run: the tiny BERT, 4 steps of 4 sequences of 32 tokens, seconds on a CPU.
# Tests that need more say so: `dataclasses.replace(TINY, max_steps=100_000)`. Sampled at 50 Hz,
# as the browser test's form run is: every phase still holds its samples (a state between two
# steps is held 5 sample periods), and the sampler, the store and the reports read a quarter of
# the default 200 Hz's rows (the default's own runs: the phase API, the callback, watch).
TINY = RunOptions(model="tiny", batch_size=4, seq_len=32, dataset_size=16, sample_rate=50)


def flags(options: RunOptions) -> list[str]:
    """`options` as the CLI's flags (`anatomy run …`): the model and its sizes always, every other
    field where it differs from RunOptions' default."""
    default = RunOptions()
    out = []
    for name in FIELDS:
        value = getattr(options, name)
        if name not in ("model", "batch_size", "seq_len", "dataset_size") and \
                value == getattr(default, name):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out += [flag] if value else []
        elif name == "lora_targets":
            out += [flag, *options.lora_targets]
        else:
            out += [flag, str(value)]
    return out


# --- the tiers ---

def pytest_configure(config):
    # One OpenMP thread for every torch this session loads, here and in each process it starts
    # (read when torch loads, after this): pytest-xdist already runs a worker per core, and each
    # worker's tests start torch processes of their own; with torch's default of a thread per
    # core they outnumber the cores and spin waiting for each other (a tiny run's worker: ~7 CPU
    # seconds, ~5.5 with one thread, on this 2-core machine). What they measure is the same.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Device locks of this test session only (its subprocesses inherit it): a dashboard running
    # beside the tests is not "busy" for them, nor they for it.
    os.environ[LOCK_DIR_ENV] = tempfile.mkdtemp(prefix="anatomy-test-locks-")
    made = [os.environ[LOCK_DIR_ENV]]
    os.environ.setdefault(SESSION_ENV, f"{os.getpid()}-{time.time_ns()}")
    # Recordings of this session only (not the user's cache): each session traces what it
    # predicts, once. pytest-xdist's workers share their controller's (they inherit its
    # environment): a recording one worker made, another reads from the disk.
    if not hasattr(config, "workerinput"):
        os.environ["ANATOMY_CACHE"] = tempfile.mkdtemp(prefix="anatomy-test-recordings-")
        made.append(os.environ["ANATOMY_CACHE"])
    config._anatomy_made = made  # removed when this process's session ends


def pytest_unconfigure(config):
    for folder in getattr(config, "_anatomy_made", ()):
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """Every test lives in a tier; those of tests/e2e/ are marked `e2e` (`-m "not e2e"`)."""
    outside = []
    for item in items:
        tier = _tier(item)
        if tier == "e2e":
            item.add_marker(pytest.mark.e2e)
        elif tier is None:
            outside.append(item.nodeid)
    if outside:
        raise pytest.UsageError("tests outside tests/unit/ and tests/e2e/ (CONTRIBUTING.md says "
                                "which tier a test goes in): " + ", ".join(outside))
    # Longest first, so that with pytest-xdist (`make test`) the minutes of a pip install or a
    # browser start at once and the many short unit tests fill the end: `pip install` into fresh
    # virtualenvs, then Chromium, then the other real processes, then the unit tier.
    items.sort(key=lambda item: (not item.get_closest_marker("packaging"),
                                 not item.get_closest_marker("browser"),
                                 _tier(item) != "e2e"))


def _tier(item) -> str | None:
    parts = Path(item.path).resolve().relative_to(PROJECT).parts
    return parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS else None


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(request, monkeypatch):
    """A unit test runs in this process: starting one is a test of the e2e tier."""
    if _tier(request.node) != "unit":
        return

    def refuse(what):
        def started(*args, **kwargs):
            raise AssertionError(f"a unit test started a process ({what}): move it to tests/e2e/")
        return started

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("subprocess"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse("multiprocessing"))


def _ours(process: psutil.Process, session: str) -> bool:
    try:
        return process.environ().get(SESSION_ENV) == session
    except psutil.Error:
        return False


def _left_behind(session: str) -> list[psutil.Process]:
    """Processes of this session still alive: those that carry its mark, but not this one, what
    what runs it, nor Python's resource tracker (it ends with its owner)."""
    me = psutil.Process()
    mine = {me.pid, *(p.pid for p in me.parents())}
    left = []
    for process in psutil.process_iter():
        if process.pid in mine or not _ours(process, session):
            continue
        try:
            if process.status() == psutil.STATUS_ZOMBIE or \
                    "resource_tracker" in " ".join(process.cmdline()):
                continue
        except psutil.Error:
            continue
        left.append(process)
    return left


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """No process a test started outlives the session (checked once, where the session began).
    Those left are named, then killed by pid, so that the next session starts clean."""
    if hasattr(session.config, "workerinput"):
        return  # a pytest-xdist worker: the controller checks after every worker has ended
    mark = os.environ.get(SESSION_ENV, "")
    if not mark.startswith(f"{os.getpid()}-"):
        return  # this session was started by another one's test: that one checks
    # A process ending as the last test ends gets its time.
    if within(10, lambda: not _left_behind(mark), every=0.2) or not (left := _left_behind(mark)):
        return
    names = []
    for process in left:
        try:
            names.append(f"{process.pid} {' '.join(process.cmdline())[:160]}")
            process.kill()
        except psutil.Error:
            pass
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter:
        reporter.write_line("")
        reporter.write_line("processes left behind by the tests (now killed):", red=True)
        for name in names:
            reporter.write_line(f"  {name}", red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --- each test's own store, and what goes in it ---

@pytest.fixture(autouse=True)
def _own_store(tmp_path, monkeypatch):
    """Every test gets its own store file, so nothing touches data/."""
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "anatomy.sqlite"))


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "anatomy.sqlite")


@pytest.fixture(scope="session")
def postgres():
    """A private PostgreSQL cluster for this session (tests/postgres.py)."""
    from tests.postgres import Cluster, binaries
    found = binaries()
    if found is None:
        pytest.skip("PostgreSQL's server is not installed (apt-get install postgresql)")
    cluster = Cluster(found)
    yield cluster
    cluster.remove()


@pytest.fixture
def pg_url(postgres, monkeypatch) -> str:
    """A fresh database of the session's cluster: its URL, without its password, which libpq
    reads from $PGPASSWORD as psql would (a test passes the URL wherever a file's path went)."""
    from tests.postgres import PASSWORD
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    return postgres.new_database(password=False)


@pytest.fixture
def manager(store):
    manager = RunManager(store)
    yield manager
    manager.stop_all()


@pytest.fixture
def tiny() -> RunOptions:
    """The tiny run's options (TINY): `dataclasses.replace(tiny, …)` for a variation."""
    return TINY


# A published token classifier (dslim/bert-base-NER: BERT base, nine CoNLL-2003 entity tags),
# shrunk for the CPU as the published configs of tests/e2e/test_families.py are: its own
# settings and labels, two layers of width 64, a 1,024-token vocabulary.
NER_SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "vocab_size": 1024}


def small_ner_config() -> dict:
    published = json.loads((PROJECT / "bench" / "models" / "bert-base-ner.json").read_text())
    return {**published, **NER_SMALL}


@pytest.fixture
def token_classifier(tmp_path) -> str:
    """The small NER model's folder (its config.json), as a run names it."""
    folder = tmp_path / "bert-ner"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(small_ner_config()))
    return str(folder)


@pytest.fixture
def fresh_nvml():
    """NVML's init state is per process: tests that swap its library start and end clean."""
    nvml.reset()
    saved = nvml._lib
    yield
    nvml._lib = saved
    nvml.reset()


def _forget_the_servers_machine() -> None:
    """The dashboard's server asks for the machine once a process: ask again."""
    server = sys.modules.get("anatomy.dashboard.server")
    if server is not None:
        server.device.clear()


def _fake_nvml(gpus: int) -> None:
    nvml._lib = FakePynvml(gpus=gpus) if gpus else \
        FakePynvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)  # no driver: a CPU machine
    nvml.reset()
    _forget_the_servers_machine()


@pytest.fixture(autouse=True)
def _unit_tests_see_the_fake_nvml(request, monkeypatch):
    """A unit test sees a machine without a GPU driver, whatever machine runs it (its GPUs, if
    it has any, through `fake_machine`): its device branch follows the fake NVML (at the one
    wrapper), never the machine. The e2e tier's processes read the real NVML."""
    if _tier(request.node) != "unit":
        yield
        return
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    saved = nvml._lib
    _fake_nvml(0)
    yield
    nvml._lib = saved
    nvml.reset()
    _forget_the_servers_machine()


@pytest.fixture
def fake_machine(fresh_nvml, monkeypatch) -> Callable[[int], Machine]:
    """fake_machine(gpus) -> this machine as anatomy sees it when NVML (faked at its wrapper)
    answers with `gpus` GPUs (0: no driver, as on a CPU machine); the dashboard's server asks
    again."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def make(gpus: int) -> Machine:
        _fake_nvml(gpus)
        return machine()

    yield make
    _forget_the_servers_machine()


GIB_BYTES = 1024**3


def seed_run(store: Store, status: str = "completed", backend: str = "nvml", gpus: int = 1,
             phases_reached: int = 4, error: str | None = None) -> int:
    """A run as the collector writes one, without training: the pages and figures read it back.

    Memory climbs 1, 2, 3, 4 GiB as the phases end at 1, 3, 5 and 9 s; the training GPU is 0,
    any other GPU stays at 0.5 GiB. The allocator's figures come with each step on a GPU."""
    options = {**RunOptions(preset="bert-large-uncased").to_dict(), "max_steps": 8}
    run_id = store.create_run(options, backend, "v2" if backend == "nvml" else "rss", 0,
                              {"gpu_name": "NVIDIA H200" if backend == "nvml" else None})
    ends = [1.0, 3.0, 5.0, 9.0][:phases_reached]
    samples = []
    for i in range(int(ends[-1] * 10) + 1):
        t = i / 10
        level = next((k + 1 for k, end in enumerate(ends) if t <= end), len(ends))
        for gpu in range(gpus):
            used = level * GIB_BYTES if gpu == 0 else GIB_BYTES // 2
            samples.append(Sample(t, gpu, used, None, 141 * GIB_BYTES, None))
    marks = []
    for name, start, end in zip(("baseline", "kernel", "weights", "training"),
                                (0.1, 2.0, 4.0, 6.0), ends):
        marks.append(PhaseMark("start", name, start))
        if status != "running" or end != ends[-1]:
            marks.append(PhaseMark("end", name, end))
    on_gpu = backend == "nvml"
    steps = [Step(6.0 + k * 0.4, k, 8, 1.0 / k, k * 10**8 if on_gpu else None,
              2 * GIB_BYTES if on_gpu else None) for k in range(1, 9)] if phases_reached == 4 else []
    store.write(run_id, samples=samples, phases=marks, steps=steps)
    if status == "running":
        store.update_run(run_id, worker_pid=os.getpid())  # a live worker: this very process
        return run_id
    store.update_run(run_id, samples_sent=len(samples))
    if status == "completed":
        store.update_run(run_id, summary={"time_s": 3.21, "samples_per_second": 9.97, "steps": 8})
    store.finish(run_id, status, error)
    return run_id


@pytest.fixture
def seed(store):
    """seed(**kwargs) -> run id: `seed_run` on this test's store."""
    return functools.partial(seed_run, store)


@pytest.fixture
def model_gone(store, tmp_path, monkeypatch):
    """model_gone(kept=True) -> run id: a CPU run started in a project folder with `--model
    my-bert` (a folder of the user's as transformers' save_pretrained writes one, named relative
    to that project), the folder deleted since, this test now in another folder. `kept`: the
    run keeps its model as the manager writes it when a run starts (False: a run stored before
    runs kept it, by its name alone)."""
    from transformers import BertConfig

    from anatomy.analysis import carried_model, models

    def make(kept: bool = True) -> int:
        project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
        elsewhere.mkdir()
        BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=128, vocab_size=1000, max_position_embeddings=64
                   ).save_pretrained(project / "my-bert")
        monkeypatch.chdir(project)
        run_id = seed_run(store, backend="cpu-rss")
        store.update_run(run_id, preset="my-bert", options=RunOptions(
            model="my-bert", batch_size=2, seq_len=32).to_dict())
        facts = carried_model.kept(models.resolve("my-bert"))
        store.merge_environment(run_id, facts if kept else {"model": facts.model,
                                                            "model_source": facts.model_source})
        shutil.rmtree(project / "my-bert")
        monkeypatch.chdir(elsewhere)
        return run_id

    return make


# A user's own model: the tiny preset's shape with three layers and a classification head, as the
# callback records a model's config (not a preset of anatomy's own).
USERS_MODEL = {**json.loads((PROJECT / "anatomy" / "analysis" / "configs" / "tiny.json")
                            .read_text()),
               "num_hidden_layers": 3, "architectures": ["BertForSequenceClassification"]}
USERS_PARAMETERS = 4_584_450  # BertForSequenceClassification(BertConfig(**USERS_MODEL))
USERS_SHAPES = ("trainer", "phase api", "command")


def seed_users_run(store: Store, shape: str = "trainer", name: str | None = None,
                   status: str = "completed") -> int:
    """A run a user's own training recorded on a CPU, as the collector writes one:

    - "trainer": a Trainer script with `AnatomyCallback()` only (the callback started the run): the
      weights and training phases, 8 steps with their loss, what TrainingArguments said, the
      model's config, the Trainer's figures and the components the callback measured;
    - "phase api": a plain loop with `anatomy.start(name=…)`, `run.phase(…)`, `run.step(loss=…)`:
      the four phases and 8 steps, no option and no model reported;
    - "command": `anatomy watch -- python train.py` of a script that marks nothing: one "process"
      phase, nothing else.

    Memory climbs 300, 400, 500, 700 MB as the phases end at 1, 3, 5 and 9 s."""
    assert shape in USERS_SHAPES
    environment = {"gpu_name": None, "gpu_count": 0, "ram_total": 24 * GIB_BYTES, "host": "laptop"}
    options: dict = {}
    if shape == "trainer":
        options = {"batch_size": 8, "grad_accum": 1, "precision": "fp32",
                   "gradient_checkpointing": False, "optim": "adamw_torch_fused", "seed": 42,
                   "max_steps": None, "epochs": 1, "seq_len": 64}
        environment.update(training_arguments={k: v for k, v in options.items() if k != "seq_len"},
                           world_size=1, model_class="BertForSequenceClassification",
                           model_name="BertForSequenceClassification", model_config=USERS_MODEL,
                           parameters=USERS_PARAMETERS, trainable_parameters=USERS_PARAMETERS)
    source = ({"kind": "watch", "command": ["python", "train.py"], "cwd": "/home/user/project"}
              if shape == "command" else
              {"kind": "script", "script": "/home/user/project/train.py", "argv": ["train.py"],
               "cwd": "/home/user/project"})
    preset = "BertForSequenceClassification" if shape == "trainer" else (
        "python train.py" if shape == "command" else "train.py")
    run_id = store.create_run(options, "cpu-rss", "rss", 0, environment, name=name,
                              source=source, preset=preset)
    spans = {"trainer": (("weights", 2.0, 5.0), ("training", 6.0, 9.0)),
             "phase api": (("baseline", 0.1, 1.0), ("kernel", 2.0, 3.0), ("weights", 4.0, 5.0),
                           ("training", 6.0, 9.0)),
             "command": (("process", 0.0, 9.0),)}[shape]
    levels = (300, 400, 500, 700)
    samples = [Sample(i / 10, 0, levels[min(3, int(i / 10 / 2.3))] * 2**20, None, None, None)
               for i in range(91)]
    marks = [mark for name_, start, end in spans for mark in (
        PhaseMark("start", name_, start),
        *((PhaseMark("end", name_, end),) if status != "running" or end != 9.0 else ()))]
    steps = [] if shape == "command" else [Step(6.0 + k * 0.3, k, 8, 1.0 / k, None, None)
                                           for k in range(1, 9)]
    store.write(run_id, samples=samples, phases=marks, steps=steps)
    if status == "running":
        store.update_run(run_id, worker_pid=os.getpid())
        return run_id
    store.update_run(run_id, samples_sent=len(samples))
    if shape == "trainer":  # the Trainer's figures, and the components the callback measured
        store.update_run(run_id, summary={
            "steps": 8, "time_s": 2.4, "samples_per_second": 26.7, "loss": 0.69, "components": {
                "weights": 4 * USERS_PARAMETERS, "gradients": 4 * USERS_PARAMETERS,
                "optimizer_states": 8 * USERS_PARAMETERS, "activations": 30 * 2**20,
                "steps_measured": 3}})
    elif shape == "command":
        store.update_run(run_id, summary={"exit_code": 0})
    store.finish(run_id, status)
    return run_id


@pytest.fixture
def seed_users(store):
    """seed_users(shape, **kwargs) -> run id: `seed_users_run` on this test's store."""
    return functools.partial(seed_users_run, store)


# --- runs moving between stores (export, import) ---

@pytest.fixture
def source(tmp_path) -> tuple[Store, list[int]]:
    """Three runs as they come out of real use: completed (two GPUs, named, tagged, a message,
    from a sweep), out of memory, and still running."""
    store = Store(tmp_path / "source.sqlite")
    done = seed_run(store, gpus=2)
    store.write(done, messages=[Message(0.5, "warning", "eval_strategy 'no'")])
    store.rename_run(done, "walkthrough")
    store.set_tags(done, ["h200", "baseline"])
    store.update_run(done, sweep="abc123")
    oom = seed_run(store, status="oom", error="CUDA out of memory. Tried to allocate 1.00 GiB")
    running = seed_run(store, status="running")
    return store, [done, oom, running]


@pytest.fixture
def target(tmp_path) -> Store:
    """A store that holds a run already, so imported runs get ids of their own."""
    store = Store(tmp_path / "target.sqlite")
    seed_run(store)
    return store


def exported(store: Store, run_ids: list[int]) -> str:
    return json.dumps(transfer.export_runs(store, run_ids), default=str)  # as `export` writes it


def contents(store: Store) -> list:
    """Everything a store holds, to prove a refused import changed nothing."""
    with store.connect() as db:
        return [[tuple(row) for row in db.execute(f"SELECT * FROM {table}")]
                for table in ("runs", "samples", "phases", "steps", "messages")]



# --- a user's dataset and tokenizer, made as users make them ---

# The tokenizer's words, one token each (a WordLevel model split on whitespace, no special
# tokens): a text of n words is n tokens long.
WORDS = ("the", "a", "cat", "dog", "sat", "on", "mat", "and", "ran", "far", "away", "big", "small",
         "red", "blue", "slowly")


class TextData(NamedTuple):
    """A dataset of texts as users write them, and its tokenizer: `dataset` saved with
    `save_to_disk` (a Dataset), `splits` a DatasetDict (train and test) saved alike, `lines` the
    same texts as JSON lines, `tokenizer` a fast tokenizer saved with save_pretrained."""

    dataset: Path
    splits: Path
    lines: Path
    tokenizer: Path
    lengths: tuple[int, ...]  # each text's tokens, in the dataset's order


def words(n: int, seed: int = 0) -> str:
    return " ".join(WORDS[(seed + i * 7) % len(WORDS)] for i in range(n))


def make_text_data(folder: Path, lengths: tuple[int, ...]) -> TextData:
    import datasets
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    model = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=model, pad_token="[PAD]",
                            unk_token="[UNK]").save_pretrained(folder / "tokenizer")
    texts = [words(n, seed) for seed, n in enumerate(lengths)]
    rows = datasets.Dataset.from_dict({"text": texts, "label": [i % 2 for i in range(len(texts))]})
    datasets.disable_progress_bars()
    rows.save_to_disk(str(folder / "dataset"))
    datasets.DatasetDict({"train": rows, "test": rows.select(range(1))}).save_to_disk(
        str(folder / "splits"))
    with open(folder / "texts.jsonl", "w") as file:
        file.writelines(json.dumps({"text": text}) + "\n" for text in texts)
    return TextData(folder / "dataset", folder / "splits", folder / "texts.jsonl",
                    folder / "tokenizer", lengths)


# Four texts of different lengths: one batch of four holds them all, padded to the longest.
TEXT_LENGTHS = (9, 30, 5, 17)


@pytest.fixture
def text_data(tmp_path) -> TextData:
    return make_text_data(tmp_path / "data", TEXT_LENGTHS)

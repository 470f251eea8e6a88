"""anatomy's figures in the user's own channels, with the real libraries: a Trainer script with the
callback and `report_to` (TensorBoard's event files read back, MLflow's local store, W&B offline),
and `anatomy watch --metrics-port` scraped by a real Prometheus (Debian's package)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from anatomy.analysis.report import report
from anatomy.store import Store
from anatomy.units import MIB
from tests.conftest import PROJECT
from tests.e2e.conftest import trainer_example
from tests.helpers import free_port, installed_anatomy, one_line, wait_until

SCRIPT = PROJECT / "examples" / "trainer_script.py"
SMALL = ["--steps", "3", "--seq-len", "16", "--batch-size", "4"]
# What every tracker must have been given, by the names the README lists (the integrations put
# the Trainer's training logs under train/).
NAMES = ["anatomy/peak_mib/cpu", "anatomy/weights_memory_mib", "anatomy/training_memory_mib",
         "anatomy/components/weights_mib"]


def _env(store: Store, **more: str) -> dict:
    return {**os.environ, "ANATOMY_STORE": str(store.path), "PYTHONPATH": os.pathsep.join(
        filter(None, (str(PROJECT), os.environ.get("PYTHONPATH")))), **more}


# The user's script run as it is, or under `anatomy watch` (the watch records the run; the
# script's callback reads the figures over the watch's link).
WATCH = [sys.executable, "-m", "anatomy", "watch", "--"]


def _train(store: Store, tmp_path, report_to: str, watched: bool = False, **env: str) -> None:
    """The example trained with `report_to`; its predicted peak (a test of its own, below) left
    out: what a tracker gets of the recording is checked here."""
    script = trainer_example(tmp_path, predict=False)
    result = subprocess.run(
        [*(WATCH if watched else []), sys.executable, str(script), *SMALL, "--report-to",
         report_to, "--output-dir", str(tmp_path / "out")], capture_output=True, text=True,
        timeout=300, cwd=tmp_path, env=_env(store, **env))
    assert result.returncode == 0, result.stderr[-3000:]


def _training_memory_mib(store: Store) -> float:
    """What `show` says of the training phase: the figure a tracker must have been given."""
    (run,) = store.runs()
    rep = report(store, run.id)
    return next(p.memory_bytes for p in rep.phases if p.name == "training") / MIB


@pytest.mark.parametrize("watched", [False, True], ids=["alone", "under-watch"])
def test_tensorboard_event_files_hold_anatomys_scalars(store, tmp_path, watched):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _train(store, tmp_path, "tensorboard", watched, TENSORBOARD_LOGGING_DIR=str(tmp_path / "tb"))
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {f"train/{name}" for name in NAMES} <= set(tags), tags
    assert "train/loss" in tags  # beside the Trainer's own
    (training,) = events.Scalars("train/anatomy/training_memory_mib")
    assert training.step == 3
    assert training.value == pytest.approx(_training_memory_mib(store), abs=0.01)
    # at the logging steps whose samples had reached the recording (a loaded machine's collector
    # may have had none since the log before), never above the run's peak
    peaks = events.Scalars("train/anatomy/peak_mib/cpu")
    assert peaks and {p.step for p in peaks} <= {1, 2, 3}
    (run,) = store.runs()
    assert max(p.value for p in peaks) <= max(s.used for s in store.samples(run.id)) / MIB + 0.01


def test_mlflow_local_store_holds_anatomys_metrics(store, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    # a local file store (mlflow-skinny has no SQL store); mlflow asks the opt-in for it
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    _train(store, tmp_path, "mlflow", MLFLOW_TRACKING_URI=uri, MLFLOW_EXPERIMENT_NAME="anatomy")
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("anatomy")
    (run,) = client.search_runs([experiment.experiment_id])
    assert set(NAMES) <= set(run.data.metrics), sorted(run.data.metrics)
    (training,) = client.get_metric_history(run.info.run_id, "anatomy/training_memory_mib")
    assert training.value == pytest.approx(_training_memory_mib(store), abs=0.01)


def _wandb_history(path) -> dict[str, object]:
    """The last value of each key an offline run logged, read from its .wandb file: W&B's
    records (its protobuf `Record`) in LevelDB's log format (blocks of 32 KiB, each record
    with a 7-byte header: CRC, length, kind), after the file's own 7-byte header. The Python
    reader W&B had is gone (its core is not Python), and `wandb sync` needs a server."""
    from wandb.proto import wandb_internal_pb2

    data, position, block, pending, found = path.read_bytes(), 7, 32768, b"", {}
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # a block's tail too short for a header: padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or a record's last piece
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                for item in record.history.item:
                    key = item.key or "/".join(item.nested_key)
                    found[key] = json.loads(item.value_json)
    return found


def test_wandb_offline_run_holds_anatomys_figures(store, tmp_path):
    _train(store, tmp_path, "wandb", WANDB_MODE="offline", WANDB_DIR=str(tmp_path),
           WANDB_PROJECT="anatomy", WANDB_SILENT="true")
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    history = _wandb_history(run_file)
    assert {f"train/{name}" for name in NAMES} <= set(history), sorted(history)
    assert history["train/anatomy/training_memory_mib"] == pytest.approx(
        _training_memory_mib(store), abs=0.01)


def _served(address: str) -> dict[str, list]:
    """What a /metrics endpoint serves now, read with prometheus-client's own parser; {} where it
    does not answer (yet)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(address, timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def test_a_watched_command_that_marks_no_phase_is_served_in_its_process_phase(store, tmp_path):
    """`anatomy watch --metrics-port P -- COMMAND` of a command that marks no phase of its own:
    its memory was served with phase="" while it ran, though the run has one phase, "process",
    from the command's start (`show` names it so). Served in that phase while the command runs,
    with its start among the phases' starts."""
    port, done = free_port(), tmp_path / "done"
    command = f"import os, time\nwhile not os.path.exists({str(done)!r}): time.sleep(0.02)\n"
    watch = subprocess.Popen(
        [*WATCH[:-1], "--metrics-port", str(port), "--metrics-host", "127.0.0.1", "--",
         sys.executable, "-c", command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=tmp_path, env=_env(store))
    address = f"http://127.0.0.1:{port}/metrics"
    try:
        served = wait_until(lambda: (now := _served(address)).get("anatomy_memory_used_bytes")
                            and now, 60, "the command's memory served", process=watch)
        assert {s.labels["phase"] for s in served["anatomy_memory_used_bytes"]} == {"process"}
        (start,) = served["anatomy_phase_start_timestamp_seconds"]
        assert start.labels["phase"] == "process" and start.value > 0
    finally:
        done.touch()
        _, err = watch.communicate(timeout=60)
    assert watch.returncode == 0, err
    (run,) = store.runs()
    assert [p.name for p in store.phases(run.id)] == ["process"]  # the name the run keeps


def test_anatomy_runs_predicted_peak_is_served_from_a_child_that_ends_with_the_run(store,
                                                                                  tmp_path):
    """`anatomy run --metrics-port P` serves the prediction's peak beside the memory. It was
    traced in a thread of the CLI's own, still in torch as the interpreter exited after a short
    run: "terminate called without an active exception", exit status 134, in about one run of
    six on a loaded machine. It is worked out in a child of its own (as a user's Trainer's is),
    which ends with the run."""
    import psutil

    from anatomy.prediction import breakdown

    port = free_port()
    run = subprocess.Popen(
        [sys.executable, "-m", "anatomy", "run", "--model", "tiny", "--max-steps", "100000",
         "--batch-size", "2", "--seq-len", "16", "--sample-rate", "50", "--metrics-port",
         str(port), "--metrics-host", "127.0.0.1", "--store", str(store.path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env=_env(store))
    address = f"http://127.0.0.1:{port}/metrics"
    try:
        served = wait_until(lambda: _served(address).get("anatomy_predicted_peak_bytes"), 240,
                            "the predicted peak served", process=run)
        # Traced in a child: torch is never loaded into the CLI's own process
        torch_in_front = "libtorch" in (Path("/proc") / str(run.pid) / "maps").read_text()
        children = [p for p in psutil.process_iter(["cmdline"])
                    if {"anatomy.engine.predicting", str(store.path)}
                    <= set(p.info["cmdline"] or ())]
    finally:
        run.send_signal(2)  # Ctrl-C: the run stops, its child with it
        _, err = run.communicate(timeout=120)
    assert run.returncode == 130, err[-3000:]
    assert "terminate called" not in err and not torch_in_front
    (recorded,) = store.runs()
    assert [s.value for s in served] == [breakdown.predicted_peak(report(store, recorded.id))]
    wait_until(lambda: not [p for p in children if p.is_running()
                            and p.status() != psutil.STATUS_ZOMBIE], 10, "the child's end")


PROMETHEUS = shutil.which("prometheus")


@pytest.mark.skipif(PROMETHEUS is None and not os.environ.get("CI"),
                    reason="Debian's prometheus is not installed (.ci/run installs it)")
def test_prometheus_scrapes_the_training_phases_memory_from_watch(store, tmp_path):
    assert PROMETHEUS, "Debian's prometheus is not installed: .ci/run installs it"
    endpoint, web = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 200ms\n  scrape_timeout: 200ms\n"
        "scrape_configs:\n  - job_name: anatomy\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{endpoint}']\n")
    prometheus = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{web}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        watched = subprocess.run(
            [sys.executable, "-m", "anatomy", "watch", "--metrics-port", str(endpoint),
             "--metrics-host", "127.0.0.1", "--", sys.executable, str(SCRIPT), "--steps", "40",
             "--seq-len", "16", "--batch-size", "4", "--output-dir", str(tmp_path / "out")],
            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_env(store))
        assert watched.returncode == 0, watched.stderr[-3000:]
        assert f"metrics: http://127.0.0.1:{endpoint}/metrics" in watched.stderr

        def training_memory():
            query = urllib.parse.urlencode({"query": 'max_over_time(anatomy_memory_used_bytes'
                                                     '{phase="training"}[10m])'})
            with urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/query?{query}") as answer:
                return json.load(answer)["data"]["result"]

        (series,) = wait_until(training_memory, 30, "Prometheus to answer the training's memory")
        (run,) = store.runs()
        assert series["metric"]["run"] == str(run.id)
        assert series["metric"]["device"] == "cpu" and series["metric"]["rank"] == "0"
        # the training's samples as the store has them: the highest scraped is one of them
        samples = {s.used for s in store.samples(run.id)}
        assert int(float(series["value"][1])) in samples
    finally:
        prometheus.terminate()
        prometheus.wait(30)


PLAIN_LOOP = """
import json, time
import anatomy

run = anatomy.start(name="a plain loop")
import torch

model = torch.nn.Linear(64, 64)
run.phase("weights")
run.phase("training")
for step in range(3):
    model(torch.randn(8, 64)).sum().backward()
    time.sleep(0.1)
    run.step(loss=1.0)
time.sleep(0.5)  # the samples of the last step reach the recording
print(json.dumps(run.metrics()))
print(json.dumps(run.metrics()))
run.end()
"""


@pytest.mark.parametrize("watched", [False, True], ids=["alone", "under-watch"])
def test_a_plain_loops_run_metrics_gives_the_callbacks_figures_for_its_own_logger(store,
                                                                                   tmp_path,
                                                                                   watched):
    script = tmp_path / "loop.py"
    script.write_text(PLAIN_LOOP)
    result = subprocess.run([*(WATCH if watched else []), sys.executable, str(script)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env=_env(store))
    assert result.returncode == 0, result.stderr[-3000:]
    first, second = (json.loads(line) for line in result.stdout.strip().splitlines()[-2:])
    assert {"anatomy/baseline_memory_mib", "anatomy/kernel_memory_mib",
            "anatomy/weights_memory_mib", "anatomy/peak_mib/cpu"} <= set(first), first
    (run,) = store.runs()
    weights = next(p for p in report(store, run.id).phases if p.name == "weights")
    assert first["anatomy/weights_memory_mib"] == pytest.approx(weights.memory_bytes / MIB,
                                                                abs=0.01)
    assert not set(second) & {"anatomy/baseline_memory_mib", "anatomy/weights_memory_mib"}


UNTIL_PREDICTED = """
import sys, time
import numpy as np
import anatomy
from datasets import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, \\
    TrainingArguments

class UntilPredicted(TrainerCallback):
    '''The user's own callback: trains until the logs carry the predicted peak (at most 180 s).'''

    began = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.05)
        if time.monotonic() - self.began > 180:
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "anatomy/predicted_peak_mib" in logs:
            print("predicted at step", state.global_step, flush=True)
            control.should_training_stop = True

config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=128, vocab_size=1000, max_position_embeddings=64)
model = BertForSequenceClassification(config)
rng = np.random.default_rng(0)
data = Dataset.from_dict({"input_ids": rng.integers(100, 1000, (64, 16)),
                          "labels": rng.integers(0, 2, (64,))})
data.set_format("pt")
arguments = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=4,
                              max_steps=100000, logging_steps=1, report_to=["tensorboard"],
                              save_strategy="no", disable_tqdm=True)
trainer = Trainer(model=model, args=arguments, train_dataset=data, callbacks=[UntilPredicted()])
anatomy.AnatomyCallback.attach(trainer)
trainer.train()
"""


@pytest.mark.parametrize("watched", [False, True], ids=["alone", "under-watch"])
def test_a_users_trainer_logs_the_predicted_peak_worked_out_beside_it(store, tmp_path, watched):
    """The prediction traces in a process of its own, started at the first step; its peak
    joins the logs once known, as `anatomy run`'s does, the one the Anatomy page gives the run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from anatomy.prediction import breakdown

    script = tmp_path / "train.py"
    script.write_text(UNTIL_PREDICTED)
    result = subprocess.run([*(WATCH if watched else []), sys.executable, str(script),
                             str(tmp_path / "out")], capture_output=True, text=True,
                            timeout=400, cwd=tmp_path,
                            env=_env(store, TENSORBOARD_LOGGING_DIR=str(tmp_path / "tb")))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "predicted at step" in result.stdout, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    (*_, logged) = events.Scalars("train/anatomy/predicted_peak_mib")
    (run,) = store.runs()
    expected = breakdown.predicted_peak(report(store, run.id))
    assert expected is not None and logged.value == pytest.approx(expected / MIB, abs=0.01)

    def gone() -> bool:  # it ends as it answers: no process outlives its run
        return subprocess.run(["pgrep", "-f", f"anatomy.engine.predicting {store.path}"],
                              capture_output=True).returncode == 1

    wait_until(gone, 10, "the prediction's process to end")


def test_a_prediction_that_cannot_be_made_says_why_in_one_line(store):
    """Its process answers with the reason, never a traceback (the callback says it in one line
    and the training goes on)."""
    import threading

    from anatomy.engine.predicting import Predicting

    answers, answered = [], threading.Event()
    Predicting(store.locator(), 999, None, lambda answer: (answers.append(answer), answered.set()))
    assert answered.wait(120)
    (answer,) = answers
    assert answer.peak is None
    assert answer.why == f"run 999 is not in the store {store.path}"


def test_a_library_older_than_declared_is_said_and_the_run_recorded_without_a_prediction(
        store, tmp_path):
    """An environment whose torch is below the installed package's floor (its metadata, as pip
    writes it, first on the path): the callback says so in one line instead of starting the
    prediction's process, and records the run."""
    import importlib.metadata

    site = installed_anatomy(tmp_path / "site", "torch>=99")
    env = _env(store)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    result = subprocess.run([sys.executable, str(SCRIPT), *SMALL, "--output-dir",
                             str(tmp_path / "out")], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = store.runs()
    torch = importlib.metadata.version("torch")
    assert (f"anatomy: run {run.id}: no predicted peak for the Trainer's logs: this environment "
            f"holds torch {torch} (anatomy needs >=99): pip install --upgrade 'torch>=99'\n"
            ) in result.stderr
    assert "Traceback" not in result.stderr
    assert run.status == "completed" and store.samples(run.id)


UNPRIVILEGED = ["setpriv", "--bounding-set=-net_bind_service", "--inh-caps=-net_bind_service",
                "--"]  # root without the right to bind a port below 1024, as any other user


def test_a_port_below_1024_without_the_right_to_it_says_what_it_needs(tmp_path):
    """"cannot listen on localhost:80 (Permission denied)" left the user to guess why."""
    prefix = UNPRIVILEGED if os.geteuid() == 0 else []
    if prefix and shutil.which("setpriv") is None:
        pytest.skip("needs util-linux's setpriv to drop root's right to low ports")
    port = 1023
    probe = subprocess.run([*prefix, sys.executable, "-c", "import socket; socket.socket().bind("
                            f"('127.0.0.1', {port}))"], capture_output=True, text=True)
    if "PermissionError" not in probe.stderr:
        pytest.skip("this machine lets any user listen below 1024 (ip_unprivileged_port_start)")
    done = subprocess.run([*prefix, sys.executable, "-m", "anatomy", "watch", "--store",
                           str(tmp_path / "runs.sqlite"), "--metrics-port", str(port), "--",
                           sys.executable, "-c", "pass"], capture_output=True, text=True,
                          cwd=PROJECT, timeout=120)
    assert done.returncode == 2
    assert one_line(done.stderr) == (
        f"error: --metrics-port {port}: cannot listen on localhost:{port} (Permission denied:"
        " a port below 1024 is root's, or needs the capability CAP_NET_BIND_SERVICE; give one"
        " from 1024)\n")

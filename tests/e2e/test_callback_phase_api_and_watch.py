"""Runs anatomy did not start: a user's Trainer with the callback, a plain loop with the phase
API, and `anatomy watch -- COMMAND` — each a real process on this CPU, recorded into a store."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys

import psutil
import pytest

from anatomy.analysis.report import report
from anatomy.prediction import breakdown
from anatomy.store import PHASES, Store
from anatomy.units import mib_text
from anatomy.views.anatomy import user_run_basis
from anatomy.vocabulary import phase_name
from tests.conftest import PROJECT
from tests.e2e.conftest import PADDED_TRAINER_SCRIPT, left
from tests.helpers import on_screen, wait_until

EXAMPLES = PROJECT / "examples"
SMALL = ["--steps", "3", "--seq-len", "16", "--batch-size", "4"]


def _env(store: Store) -> dict:
    return {**os.environ, "ANATOMY_STORE": str(store.path), "PYTHONPATH": os.pathsep.join(
        filter(None, (str(PROJECT), os.environ.get("PYTHONPATH"))))}


def _python(store: Store, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=PROJECT, env=_env(store))


def _users_script(store: Store, folder, text: str, *args: str) -> subprocess.CompletedProcess:
    """A user's script, written into its own folder and run there, recording into `store`;
    its exit status asserted 0."""
    script = folder / "train.py"
    script.write_text(text)
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                            text=True, timeout=600, cwd=folder, env=_env(store))
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _only_run(store: Store):
    runs = store.runs()
    assert len(runs) == 1, [(r.id, r.source) for r in runs]
    return report(store, runs[0].id)


def _assert_recorded_walkthrough(rep) -> None:
    assert rep.status == "completed", rep.error
    assert [p.name for p in rep.phases] == list(PHASES)
    assert all(p.done and p.memory_bytes for p in rep.phases)
    assert rep.samples == rep.samples_sent > 0  # the sampler lost nothing


def test_the_plain_loop_records_its_phases_and_steps_with_the_phase_api(store):
    result = _python(store, str(EXAMPLES / "plain_loop.py"), *SMALL)
    assert result.returncode == 0, result.stderr
    rep = _only_run(store)
    _assert_recorded_walkthrough(rep)
    assert rep.source.kind == "script" and rep.source.script.endswith("plain_loop.py")
    assert [(s.step, s.total) for s in store.steps(rep.id)] == [(1, 3), (2, 3), (3, 3)]
    assert all(s.loss is not None for s in store.steps(rep.id))
    # run.step(batch_size=4): its batch size and speed, as a Trainer's run has them (before:
    # no samples/s on any page, nor in `show`)
    assert rep.ran_with.batch_size == 4 and rep.summary.steps == 3
    assert rep.summary.samples_per_second > 0
    shown = subprocess.run([sys.executable, "-m", "anatomy", "show", str(rep.id)],
                           capture_output=True, text=True, timeout=120, cwd=PROJECT,
                           env=_env(store))
    assert "Samples/second: " in shown.stdout, shown.stdout + shown.stderr
    # a title names the script by its file (the full path is the run's origin, on its own line)
    assert rep.title().endswith("(script plain_loop.py)") and rep.origin.endswith("plain_loop.py")
    _assert_libraries(rep)


def test_a_scripts_one_step_gives_its_run_no_time_and_no_speed(store):
    """`run = anatomy.start(); run.step(batch_size=8)` once: `show` said "Time: 0.00 s" and
    "Samples/second: 18860.00" (a step reported as the training phase began), or a speed over
    loading torch (no training phase marked). No time to measure a speed in: the run keeps its
    step, and says neither."""
    for marks in ("", "run.phase('training')\n"):
        script = ("import anatomy\nrun = anatomy.start(kernel=False)\n" + marks
                  + "run.step(loss=1.0, batch_size=8)\nrun.end()\n")
        result = _python(store, "-c", script)
        assert result.returncode == 0, result.stderr
        run = max(store.runs(), key=lambda r: r.id)  # this script's
        rep = report(store, run.id)
        assert rep.steps == 1 and (rep.summary.time_s, rep.summary.samples_per_second) == (
            None, None)
        shown = _python(store, "-m", "anatomy", "show", str(run.id)).stdout
        assert "steps: 1" in shown and "Time:" not in shown and "Samples/second" not in shown


def _assert_libraries(rep) -> None:
    """What the script trained with, as it loaded them (`show` said "torch: -")."""
    import torch
    import transformers

    assert (rep.environment.torch, rep.environment.transformers) == (
        str(torch.__version__), transformers.__version__)


def test_the_trainer_callback_records_phases_steps_and_components(store):
    # Three layers: not the shape of anatomy's own tiny preset, so its prediction is the user's.
    result = _python(store, str(EXAMPLES / "trainer_script.py"), *SMALL, "--layers", "3")
    assert result.returncode == 0, result.stderr
    rep = _only_run(store)
    _assert_recorded_walkthrough(rep)
    assert rep.steps == 3 and rep.summary.time_s > 0 and rep.summary.samples_per_second > 0
    assert rep.stored_options["batch_size"] == 4 and rep.stored_options["precision"] == "fp32"
    parameters = rep.environment.parameters
    assert rep.components.weights == rep.components.gradients == 4 * parameters
    assert rep.components.optimizer_states == 8 * parameters  # AdamW: two fp32 moments
    assert rep.preset == rep.environment.model_name
    _assert_libraries(rep)
    # What a prediction needs was recorded: the model's config and the training set's shape; the
    # Anatomy page predicts the user's model from them (not a preset of anatomy's own).
    assert rep.stored_options["seq_len"] == 16
    prediction = breakdown.prediction_for(rep)
    assert prediction.parameters == parameters
    assert prediction.as_components().weights == rep.components.weights
    assert [s.seq_len for s in store.steps(rep.id)] == [16, 16, 16]  # each step's, as trained
    assert "sequence length 16 (the longest batch it trained on: every one of its 3 steps)" in \
        user_run_basis(rep, store.steps(rep.id))
    # Which run, which store: said when it starts and when it ends.
    assert f"anatomy: recording run {rep.id} into {store.path}" in result.stderr
    assert f"anatomy: run {rep.id} completed, stored in {store.path}" in result.stderr


def test_a_trainer_padding_each_batch_is_predicted_at_the_longest_batch_it_trained_on(store,
                                                                                        tmp_path):
    """A run with dynamic padding was recorded at its first example's length (16): its
    activations predicted at 9.8 MB beside 233 MB measured. Each step's length is recorded, and
    the prediction is made at the longest batch (the peak is made there)."""
    result = _users_script(store, tmp_path, PADDED_TRAINER_SCRIPT)
    rep = _only_run(store)
    assert rep.status == "completed", rep.error
    lengths = [s.seq_len for s in store.steps(rep.id)]
    assert len(lengths) == 3 and None not in lengths and len(set(lengths)) > 1
    examples = result.stdout.strip().splitlines()[-1]  # a batch is padded to one example's length
    assert set(lengths) <= {int(n) for n in examples.strip("[]").split(",")}
    assert rep.stored_options["seq_len"] == max(lengths) > 16
    assert f"sequence length {max(lengths)} (the longest batch it trained on: " \
           f"{min(lengths)} to {max(lengths)} tokens over 3 steps)" in \
        user_run_basis(rep, store.steps(rep.id))
    # A script that adds the callback and nothing else says which run and which store.
    assert f"anatomy: recording run {rep.id} into {store.path}" in result.stderr


EVALUATES_WHILE_TRAINING = """
import sys
import anatomy
anatomy.start(name="evaluates")
import numpy as np
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, vocab_size=4000)
ids = np.random.default_rng(0).integers(10, 3900, (64, 64))
data = Dataset.from_dict({"input_ids": ids, "labels": ids})
data.set_format("pt")
training = TrainingArguments(output_dir="out", use_cpu=True, report_to=[], save_strategy="no",
                             per_device_train_batch_size=2, max_steps=6, disable_tqdm=True,
                             eval_strategy="no" if sys.argv[1] == "after" else "steps",
                             eval_steps=3, eval_on_start=sys.argv[1] == "start",
                             per_device_eval_batch_size=256)
# Eight evaluation batches, not one: the sampler (200 Hz, on a loaded machine) sees the
# evaluation's memory however short a batch's forward pass is. Each batch's logits (256 MB) pass
# the pages the training freed: at 64 samples (65 MB) the allocator could hold them in those, and
# the RSS did not rise once in CI.
evaluation = Dataset.from_dict({"input_ids": np.tile(ids, (32, 1)),
                                "labels": np.tile(ids, (32, 1))})
evaluation.set_format("pt")
trainer = Trainer(model=LlamaForCausalLM(config), args=training, train_dataset=data,
                  eval_dataset=evaluation)
anatomy.AnatomyCallback.attach(trainer)
trainer.train()
if sys.argv[1] == "after":  # as transformers' example scripts do
    trainer.evaluate()
"""


@pytest.mark.parametrize("when", ["steps", "start", "after"])
def test_a_trainer_that_evaluates_is_read_before_its_first_evaluation(store, tmp_path, when):
    """A user's Trainer evaluates while it trains (eval_strategy), here at 128 times its training
    batch: the evaluation's batch and logits made the run's peak (91 MiB of RSS above the
    training's on a CPU), and the table held that against a training step's prediction. The
    first evaluation is recorded; the components' peak is the training's before it, the
    whole run's is said beside it; so for `trainer.evaluate()` after training, as transformers'
    example scripts do. An evaluation before any step (eval_on_start) leaves no training to
    read apart: the peak is the whole run's."""
    from anatomy.views.anatomy import component_rows, evaluation_line, waterfall

    _users_script(store, tmp_path, EVALUATES_WHILE_TRAINING, when)
    rep = _only_run(store)
    assert rep.status == "completed", rep.error
    assert rep.environment.eval_batch_size == 256
    steps = store.steps(rep.id)
    evaluated = rep.environment.evaluated_at
    baseline = rep.phase_memory()["baseline"]
    whole = rep.summary.peak_bytes - baseline
    if when == "start":
        assert evaluated < steps[0].t and rep.evaluated_from is None
        assert rep.components.peak == whole and evaluation_line(rep) is None
        return
    if when == "steps":
        assert steps[2].t < evaluated < steps[3].t  # after step 3, eval_steps=3
    else:
        assert steps[-1].t < evaluated
    assert rep.evaluated_from == evaluated
    assert rep.components.peak == store.peak(rep.id, rep.gpu, before=evaluated) - baseline
    assert rep.components.peak < whole  # the evaluation's 256 samples held more
    line = evaluation_line(rep)
    assert "(batch 256 a device)" in line and mib_text(whole) in line
    # the table and the waterfall hold the training's peak against the prediction
    prediction = breakdown.predicted(rep)
    rss = component_rows(rep, prediction)[-1]
    assert (rss.component, rss.measured) == ("peak (RSS, over the baseline)", rep.components.peak)
    climb = waterfall(rep, prediction)["measured"]
    assert sum(step.bytes for step in climb if step.measure == "relative") == rep.components.peak
    shown = _python(store, "-m", "anatomy", "show", str(rep.id)).stdout
    assert "evaluated from" in shown


# A small Llama and its data, for the Trainer scripts that run out of memory below.
SMALL_LLAMA = """
import numpy as np, torch
from datasets import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments)
config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, vocab_size=2000)
ids = np.random.default_rng(0).integers(10, 1900, (64, 48))
data = Dataset.from_dict({"input_ids": ids, "labels": ids})
data.set_format("pt")
"""

ONLY_EVALUATES = """
import anatomy
from transformers import Trainer, TrainingArguments
""" + SMALL_LLAMA + """
arguments = TrainingArguments(output_dir="out", use_cpu=True, report_to=[], save_strategy="no",
                              per_device_eval_batch_size=8, disable_tqdm=True,
                              per_device_train_batch_size=2, gradient_accumulation_steps=4)
trainer = Trainer(model=LlamaForCausalLM(config), args=arguments, eval_dataset=data,
                  callbacks=[anatomy.AnatomyCallback()])
trainer.evaluate()
"""


def test_a_trainer_that_only_evaluates_says_why_its_run_has_no_training_phase(store, tmp_path):
    """A user's Trainer with the callback that evaluates and never trains (`trainer.evaluate()`
    alone): its run was `completed` with a weights phase alone, and nothing said why. The run
    says it, in its messages (`show` prints them) and on the script's terminal."""
    result = _users_script(store, tmp_path, ONLY_EVALUATES)
    rep = _only_run(store)
    assert rep.status == "completed" and [p.name for p in rep.phases] == ["weights"]
    words = ("no training phase: the Trainer evaluated (trainer.evaluate()) and never trained "
             "(no trainer.train()); the memory after its weights phase is the evaluation's")
    assert [(m.level, m.text) for m in rep.messages] == [("warning", words)]
    assert f"anatomy: run {rep.id}: {words}" in result.stderr
    shown = _python(store, "-m", "anatomy", "show", str(rep.id)).stdout
    assert f"warning: {words}" in shown
    # Its options are the evaluation's (batch 8), none of the training's it never ran (batch 2,
    # 4 micro-batches a step, its optimizer, its epochs)
    assert "options: batch_size=8, precision=fp32, weights=fp32\n" in shown
    header, row = _python(store, "-m", "anatomy", "runs").stdout.splitlines()[:2]
    assert row[header.index("batch"):].split()[0] == "8", (header, row)  # the Batch column


FINDS_ITS_BATCH_SIZE = """
import anatomy
anatomy.start(name="auto batch")
""" + SMALL_LLAMA + """

class OutOfMemoryOnce(TrainerCallback):
    # the GPU's error at the first attempt's second step, as a batch too large for it raises
    fired = False

    def on_step_end(self, args, state, control, **kwargs):
        if not OutOfMemoryOnce.fired and state.global_step == 2:
            OutOfMemoryOnce.fired = True
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


training = TrainingArguments(output_dir="out", use_cpu=True, report_to=[], save_strategy="no",
                             per_device_train_batch_size=8, max_steps=4, disable_tqdm=True,
                             auto_find_batch_size=True)
trainer = Trainer(model=LlamaForCausalLM(config), args=training, train_dataset=data,
                  callbacks=[OutOfMemoryOnce()])
anatomy.AnatomyCallback.attach(trainer)
trainer.train()
print(trainer._train_batch_size)
"""


def test_a_trainer_that_finds_its_batch_size_is_measured_and_predicted_at_the_one_it_trains_at(
        store, tmp_path):
    """auto_find_batch_size: the Trainer ran out of memory at batch 8 and trained on at 7, but
    the run said 8, and its activations were the failed attempt's (19.8 MiB measured where the
    training held 17.3). The batch it trains at is followed: the run is described, measured and
    predicted at it, and the lowering is said."""
    result = _users_script(store, tmp_path, FINDS_ITS_BATCH_SIZE)
    trained = int(result.stdout.strip().splitlines()[-1])
    assert trained == 7  # accelerate's find_executable_batch_size: 10 % less
    rep = _only_run(store)
    assert rep.status == "completed", rep.error
    assert rep.options.batch_size == rep.environment.training_arguments.batch_size == trained
    assert rep.components.micro_batch == trained
    said = "auto_find_batch_size lowered it from 8 after an out-of-memory error"
    assert said in result.stderr
    assert any(said in message.text for message in rep.messages)
    prediction = breakdown.predicted(rep)
    assert not isinstance(prediction, breakdown.NoPrediction), prediction
    assert prediction.activations == rep.components.activations


RETRIES_AT_A_SMALLER_BATCH = """
import sys
import anatomy
if sys.argv[1] == "started":
    anatomy.start(name="retried")
""" + SMALL_LLAMA + """

class OutOfMemoryAtEight(TrainerCallback):
    # the GPU's error at batch 8's second step, as a batch too large for it raises
    def on_step_end(self, args, state, control, **kwargs):
        if args.per_device_train_batch_size == 8 and state.global_step == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


for batch in (8, 4):  # the script's own retry: another Trainer at a smaller batch
    training = TrainingArguments(output_dir="out", use_cpu=True, report_to=[],
                                 save_strategy="no", per_device_train_batch_size=batch,
                                 max_steps=4, disable_tqdm=True)
    trainer = Trainer(model=LlamaForCausalLM(config), args=training, train_dataset=data,
                      callbacks=[OutOfMemoryAtEight()])
    anatomy.AnatomyCallback.attach(trainer, predict=False)
    try:
        trainer.train()
        break
    except torch.OutOfMemoryError:
        print("out of memory at", batch)
"""


def test_a_training_that_raised_and_was_caught_is_not_the_retrys_run(store, tmp_path):
    """A script that caught the Trainer's out-of-memory error and trained another Trainer at a
    smaller batch: one run, "completed", its two trainings' steps counted as one training's (5
    steps), and nothing said of the failure. The callback's own run ends as failed, saying
    where and why, and the retry has a run of its own; a run of the script's own
    (anatomy.start()) goes on, the failure said in it."""
    stopped = ("the training stopped at step 2 of 4 without ending (the Trainer raised an error "
               "that the script caught, then trained another Trainer)")
    result = _users_script(store, tmp_path, RETRIES_AT_A_SMALLER_BATCH, "own")
    assert "out of memory at 8" in result.stdout
    failed, retried = (report(store, r.id) for r in sorted(store.runs(), key=lambda r: r.id))
    assert (failed.status, failed.error) == ("failed", stopped)  # no CUDA: no count of its OOMs
    assert failed.options.batch_size == 8 and failed.steps == 1
    assert [p.name for p in failed.phases] == ["weights", "training"]
    assert retried.status == "completed", retried.error
    assert retried.options.batch_size == 4 and retried.steps == 4
    assert [p.name for p in retried.phases] == ["weights", "training"]

    started = Store(tmp_path / "started.sqlite")
    env = {**_env(started), "ANATOMY_STORE": str(started.path)}
    result = subprocess.run([sys.executable, str(tmp_path / "train.py"), "started"],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    rep = _only_run(started)
    assert rep.status == "completed" and rep.options.batch_size == 4
    assert f"anatomy: run {rep.id}: {stopped}" in result.stderr
    assert [(m.level, m.text) for m in rep.messages] == [("warning", stopped)]


SUMMARISES = """
import anatomy
anatomy.start(name="summaries")
import numpy as np
from datasets import Dataset
from transformers import (Seq2SeqTrainer, Seq2SeqTrainingArguments, T5Config,
                          T5ForConditionalGeneration)
config = T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=2, d_kv=32, vocab_size=2000,
                  decoder_start_token_id=0)
rng = np.random.default_rng(0)
data = Dataset.from_dict({"input_ids": rng.integers(10, 1900, (32, 40)),
                          "labels": rng.integers(10, 1900, (32, 24))})
data.set_format("pt")
training = Seq2SeqTrainingArguments(output_dir="out", use_cpu=True, report_to=[],
                                    save_strategy="no", per_device_train_batch_size=4,
                                    max_steps=3, disable_tqdm=True)
trainer = Seq2SeqTrainer(model=T5ForConditionalGeneration(config), args=training,
                         train_dataset=data)
anatomy.AnatomyCallback.attach(trainer)
trainer.train()
"""


def test_a_seq2seq_trainers_targets_are_recorded_and_predicted_at_their_length(store,
                                                                                tmp_path):
    """A summary is shorter than its source (here 24 tokens for 40): the run recorded the
    source's length alone, and the prediction made the targets as long (activations 32 % over
    what the run held). The targets' length is recorded, and predicted to the byte."""
    _users_script(store, tmp_path, SUMMARISES)
    rep = _only_run(store)
    assert rep.status == "completed", rep.error
    assert (rep.options.seq_len, rep.options.target_len) == (40, 24)
    prediction = breakdown.predicted(rep)
    assert not isinstance(prediction, breakdown.NoPrediction), prediction
    parts = rep.components
    assert (prediction.weights, prediction.gradients, prediction.optimizer_states,
            prediction.activations) == (parts.weights, parts.gradients,
                                        parts.optimizer_states, parts.activations)


def test_watch_joins_the_phases_the_command_marks(store):
    result = _python(store, "-m", "anatomy", "watch", "--", sys.executable,
                      str(EXAMPLES / "plain_loop.py"), *SMALL)
    assert result.returncode == 0, result.stderr
    rep = _only_run(store)  # the script joined the watch's run: it did not start its own
    _assert_recorded_walkthrough(rep)
    assert rep.source.kind == "watch" and list(rep.source.command[-len(SMALL):]) == SMALL
    assert rep.steps == 3
    assert "status: completed" in result.stderr
    # Each phase's line as it ended, with the figure `show` prints (a phase went unsaid, and a
    # line read the sample before its end before that sample was stored: 776 MB, `show` 735).
    said = re.findall(r"^(?:GPU|CPU) memory.* occupied: ([\d,]+) MiB\.  \((.+)\)$", result.stderr,
                      re.M)
    assert {name: int(mb.replace(",", "")) for mb, name in said} == \
        {phase_name(p.name, rep.on_gpu): p.memory_mb for p in rep.phases}, result.stderr
    assert len(said) == len(rep.phases)  # each once
    # The script's anatomy.start(name=…) names the watch's run (it was the command line).
    assert rep.name == "plain loop: tiny GPT-2"
    # Its steps' batch size (run.step(batch_size=…)) is the run's, as a Trainer's is.
    assert rep.title().startswith(f"Run {rep.id}: plain loop: tiny GPT-2 — batch size 4 on ")


# A command that holds 50 MB until the watch has stored a few samples of it (a fixed sleep ends
# before the first sample on a loaded machine). A plain program, as a user's command is: it waits
# in a loop of its own, not with the tests' helper.
HOLDS_50_MB = """
import os, sqlite3, time
x = bytearray(50 * 2**20)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        with sqlite3.connect(os.environ["ANATOMY_STORE"]) as db:
            if db.execute("SELECT count(*) FROM samples").fetchone()[0] >= 5:
                break
    except sqlite3.Error:
        pass
    time.sleep(0.2)
"""


def test_watch_of_a_command_that_marks_nothing_has_one_process_phase(store):
    result = _python(store, "-m", "anatomy", "watch", "--name", "no API script", "--",
                     sys.executable, "-c", HOLDS_50_MB)
    assert result.returncode == 0, result.stderr
    rep = _only_run(store)
    assert rep.name == "no API script"  # --name is the run's name, in every page's title
    assert rep.title().startswith(f"Run {rep.id}: no API script on ")
    assert rep.status == "completed"
    assert [p.name for p in rep.phases] == ["process"] and rep.phases[0].done
    assert rep.summary.peak_bytes > 50 * 2**20  # the command's own RSS, bytearray included
    assert rep.samples == rep.samples_sent > 0


# 300 MiB written page by page (resident), then three forked copies that only sleep: they share
# every page with their parent until either writes one. {after} runs in the parent once they
# are made.
FORKS_SHARING_300_MB = """
import os, time
held = bytearray(300 * 2**20)
for i in range(0, len(held), 4096):
    held[i] = 1
children = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    children.append(pid)
time.sleep(0.5)
{after}
for pid in children:
    os.waitpid(pid, 0)
"""
# The parent writes every page again (an optimizer step rewrites every weight): it holds new
# pages, and its copies the old ones, shared among them: 600 MiB in all.
REWRITTEN = """
for i in range(0, len(held), 4096):
    held[i] = 2
"""


@pytest.mark.parametrize("after, low, high", [("", 300, 400), (REWRITTEN, 600, 700)],
                         ids=["only shared", "rewritten by the parent"])
def test_forked_copies_count_the_pages_they_share_once(store, after, low, high):
    """A DataLoader's workers (forked) share their parent's pages, and each one's RSS counts
    them: the tree's RSS was 1,642 MiB for 400 MiB held (a DataLoader of four workers: 3,754
    MiB where the tree's PSS peaked at 1,450). Counting a copy's RSS less its shared pages
    missed the old pages the copies keep, among themselves, once the parent rewrote its own."""
    result = _python(store, "-m", "anatomy", "watch", "--", sys.executable, "-c",
                     FORKS_SHARING_300_MB.format(after=after))
    assert result.returncode == 0, result.stderr
    peak = _only_run(store).summary.peak_bytes
    series = [(round(s.t, 2), s.used // 2**20) for s in store.samples(_only_run(store).id, 0)]
    assert low * 2**20 < peak < high * 2**20, series[::10]


def test_watch_of_a_command_too_short_to_sample_says_so(store):
    """`anatomy watch -- true`: it said "CPU (RSS): peak ? MB"."""
    result = _python(store, "-m", "anatomy", "watch", "--sample-rate", "1", "--", "true")
    assert result.returncode == 0, result.stderr
    assert "no sample: the command ended before the first reading (every 1000 ms)" in result.stderr
    assert "?" not in result.stderr
    assert _only_run(store).status == "completed"


def test_watch_says_its_lines_beside_the_commands_progress_bar_and_its_command_as_it_ran(
        store, tmp_path):
    """A command that draws a progress bar (tqdm: `\r` and no newline) while the watch says a
    phase's memory: the watch's line was glued to the bar ("20/40CPU memory (RSS) occupied:
    …"); now it starts a line of its own. And the command is shown as a shell would run it:
    an argument holding a space is quoted (it read `bar.py 1 a b ü`, four arguments)."""
    script = tmp_path / "bar.py"
    script.write_text("import sys, time\n"
                      "sys.stderr.write('\\r 50%|#####     | 20/40')\n"
                      "sys.stderr.flush()\n"
                      "time.sleep(0.5)\n")
    command = [sys.executable, str(script), "a b ü"]
    result = subprocess.run([sys.executable, "-m", "anatomy", "watch", "--", *command],
                            capture_output=True, timeout=300, cwd=PROJECT, env=_env(store))
    err = result.stderr.decode()
    assert result.returncode == 0, err
    shown = on_screen(err)
    assert f"watching {shlex.join(command)} (pid" in shown[0], shown
    assert " 50%|#####     | 20/40" in shown, shown
    assert shown[shown.index(" 50%|#####     | 20/40") + 1].startswith(
        "CPU memory (RSS) occupied: "), shown


def test_watch_keeps_the_order_of_what_the_command_prints_on_stdout_and_stderr(store):
    """A Trainer prints its logs on stdout and draws its progress bar on stderr: on a terminal
    (or `2>&1`) the watch read the two through two pipes, each by a thread of its own, and put
    them out in the order those threads ran ("4/6 [00:01<00:00]{'loss': 5.54, …"). Where both
    show on one screen, the command now writes them into one pipe, in its own order."""
    script = ("import sys\n"
              "for i in range(300):\n"
              "    print(f'out {i}', flush=True)\n"
              "    print(f'err {i}', file=sys.stderr, flush=True)\n")
    result = subprocess.run([sys.executable, "-m", "anatomy", "watch", "--", sys.executable,
                             "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=300, cwd=PROJECT, env=_env(store))
    assert result.returncode == 0, result.stdout
    printed = [line for line in result.stdout.splitlines() if line.startswith(("out", "err"))]
    assert printed == [f"{stream} {i}" for i in range(300) for stream in ("out", "err")]


def test_watch_of_a_command_that_fails_keeps_its_exit_code_and_output(store):
    result = _python(store, "-m", "anatomy", "watch", "--", sys.executable, "-c",
                      "import sys; print('something broke', file=sys.stderr); sys.exit(3)")
    assert result.returncode == 3
    rep = _only_run(store)
    assert rep.status == "failed"
    assert "exited with code 3" in rep.error and "something broke" in rep.error


@pytest.mark.parametrize("printed, status", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
    ("RuntimeError: [enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate"
     " memory: you tried to allocate 8 GB", "oom"),
    ("checking for out of memory conditions: none", "failed"),
])
def test_watch_calls_oom_only_torchs_out_of_memory_error(store, printed, status):
    result = _python(store, "-m", "anatomy", "watch", "--", sys.executable, "-c",
                     f"import sys; print({printed!r}, file=sys.stderr); sys.exit(1)")
    assert result.returncode == 1
    assert _only_run(store).status == status
    # Its line ends the watch's words: "oom: the command ran out of memory (exited with code
    # 1)", not with the colon the stored error's output follows (the command printed it above).
    said = result.stderr.rstrip("\n").splitlines()[-1]
    assert said == {"oom": "oom: the command ran out of memory (exited with code 1)",
                    "failed": "failed: the command exited with code 1"}[status]


def test_watch_refuses_what_it_cannot_run_and_records_nothing(store):
    result = _python(store, "-m", "anatomy", "watch", "--", "no-such-command-anywhere")
    assert result.returncode == 2 and "cannot run 'no-such-command-anywhere'" in result.stderr
    result = _python(store, "-m", "anatomy", "watch")
    assert result.returncode == 2 and "no command" in result.stderr
    assert store.runs() == []


def test_a_process_the_command_leaves_before_any_listing_is_ended_with_it(store):
    """A command that starts a helper in the background and exits at once (`sleep 600 &`, a
    script's server): the helper ran on, re-parented to init before the watch had listed the
    command's tree, and the watch waited 10 s on the output pipes it kept open. The watch is
    the subreaper of the command's processes while it runs: the helper comes to it, and is
    ended with the run."""
    result = _python(store, "-m", "anatomy", "watch", "--", sys.executable, "-c",
                     "import subprocess; print(subprocess.Popen(['sleep', '600']).pid)")
    assert result.returncode == 0, result.stderr
    helper = int(result.stdout.split()[0])
    assert not psutil.pid_exists(helper) or \
        psutil.Process(helper).status() == psutil.STATUS_ZOMBIE
    assert _only_run(store).status == "completed"


def test_ctrl_c_stops_the_watched_command_keeps_the_record_and_leaves_no_process(store):
    watcher = subprocess.Popen(
        [sys.executable, "-m", "anatomy", "watch", "--", sys.executable, "-c",
         "import time\nwhile True: time.sleep(0.1)"],
        cwd=PROJECT, env=_env(store), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True)  # its own process group: "the terminal" the test presses Ctrl-C in
    wait_until(lambda: store.runs() and store.runs()[0].worker_pid, 60,
               "the watch to record its run, its command's pid", every=0.2, process=watcher)
    wait_until(lambda: store.sample_count(store.runs()[0].id) >= 5, 60, "some samples stored",
               every=0.2, process=watcher)
    family = [psutil.Process(watcher.pid), *psutil.Process(watcher.pid).children(recursive=True)]
    os.killpg(watcher.pid, signal.SIGINT)
    assert watcher.wait(60) == 130
    rep = _only_run(store)
    assert rep.status == "stopped"
    assert rep.samples == rep.samples_sent > 0
    assert left(family) == []


SAVES_WHEN_STOPPED = """
import pathlib, signal, sys, time

class Stop(Exception):
    pass

def stop(signum, frame):
    raise Stop(signal.Signals(signum).name)

for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, stop)
try:
    print("ready", flush=True)  # inside: a signal that lands as it returns is caught too
    while True:
        time.sleep(0.05)
except Stop as why:
    time.sleep(1.5)  # the checkpoint's save: a second signal here raises Stop again, and it dies
    pathlib.Path("saved").write_text(str(why))
    print("saved", flush=True)
"""


@pytest.mark.parametrize("group", [True, False], ids=["to its group", "to the watch alone"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_reaches_the_watched_command_once(store, tmp_path, sig, group):
    """A supervisor signalling the watch's process group, with no terminal: the command got the
    signal from the group and again from the watch, and a script that saves its checkpoint when
    stopped was interrupted in the save (its data lost). Sent to the watch alone, it is passed
    on once."""
    (tmp_path / "train.py").write_text(SAVES_WHEN_STOPPED)
    watcher = subprocess.Popen(
        [sys.executable, "-m", "anatomy", "watch", "--", sys.executable, "train.py"],
        cwd=tmp_path, env=_env(store), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True)  # a group of its own and no terminal, as a supervisor starts it
    try:
        assert watcher.stdout.readline() == b"ready\n"
        wait_until(lambda: store.runs() and store.runs()[0].worker_pid, 60,
                   "the watch recording its run", every=0.1, process=watcher)
        (os.killpg if group else os.kill)(watcher.pid, sig)
        out, err = watcher.communicate(timeout=60)
    finally:
        watcher.kill()
    assert (tmp_path / "saved").exists(), err.decode()
    assert (tmp_path / "saved").read_text() == sig.name
    assert out == b"saved\n" and b"Traceback" not in err, err.decode()
    assert watcher.returncode == 128 + sig
    rep = _only_run(store)
    assert rep.status == "stopped" and sig.name in rep.error


def test_an_error_inside_the_phase_api_fails_the_run_with_the_error(store):
    script = ("import anatomy\n"
              "with anatomy.start(kernel=False) as run:\n"
              "    run.phase('training')\n"
              "    raise RuntimeError('the loss went NaN')\n")
    result = _python(store, "-c", script)
    assert result.returncode == 1 and "the loss went NaN" in result.stderr
    rep = _only_run(store)
    assert rep.status == "failed" and "RuntimeError: the loss went NaN" in rep.error
    assert [p.name for p in rep.phases] == ["baseline", "training"]
    assert all(p.done for p in rep.phases)




STOPPED_AS_IT_STARTS = """
import os, signal, sqlite3, threading, time
import anatomy

def stop_once_the_run_is_made():
    while True:
        try:
            with sqlite3.connect(os.environ["ANATOMY_STORE"]) as db:
                if db.execute("SELECT count(*) FROM runs").fetchone()[0]:
                    break
        except sqlite3.Error:  # not made yet
            pass
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=stop_once_the_run_is_made, daemon=True).start()
run = anatomy.start(kernel=False)
time.sleep(30)
"""


def test_a_stop_while_the_run_starts_ends_it_stopped(store):
    """SIGTERM while anatomy.start() made the run (its store made, the sampler starting): the
    process died by it before the run's handlers were set, and the run was left to be found
    "ended without a word". The stop ends the run it made as stopped, and the process by the
    signal, as without anatomy."""
    result = _python(store, "-c", STOPPED_AS_IT_STARTS, timeout=120)
    assert result.returncode == -signal.SIGTERM, result.stderr
    assert "Traceback" not in result.stderr
    runs = store.runs()
    assert [(r.status, r.error) for r in runs] == [("stopped", "stopped by SIGTERM")]
    assert f"run {runs[0].id} stopped, stored in" in result.stderr


def test_under_watch_a_one_process_scripts_error_names_no_rank(store):
    """A script of one process that fails under `watch` was "failed: rank 0: ValueError: …"."""
    script = ("import anatomy\n"
              "run = anatomy.start(kernel=False)\n"
              "run.phase('training')\n"
              "raise ValueError('no such column')\n")
    result = _python(store, "-m", "anatomy", "watch", "--", sys.executable, "-c", script)
    assert result.returncode == 1
    rep = _only_run(store)
    assert rep.status == "failed" and rep.error.startswith("ValueError: no such column"), rep.error
    assert "failed: ValueError: no such column" in result.stderr


def test_under_watch_a_scripts_own_store_is_said_not_used_and_the_watchs_store_records(
        store, tmp_path):
    """`anatomy.start(store=…)` in a script run under `anatomy watch --store …`: the run went
    into the watch's store, and the script's store was ignored without a word (the user looked
    for the run there). The watch records, as its environment tells the script; the script's
    store is said not used, in one line naming both; so is what else the watch decides
    (sample_rate=, gpus=), and nothing of a store that is the watch's own."""
    own = tmp_path / "own.sqlite"
    script = ("import anatomy\n"
              f"run = anatomy.start(store={str(own)!r}, kernel=False)\n"
              "run.step(loss=1.0)\n")
    result = _python(store, "-m", "anatomy", "watch", "--store", str(store.path), "--",
                     sys.executable, "-c", script)
    assert result.returncode == 0, result.stderr
    rep = _only_run(store)
    said = [line for line in result.stderr.splitlines()
            if line.startswith("anatomy:") and str(own) in line]
    assert said == [f"anatomy: run {rep.id} is recorded by the `anatomy watch` this script runs "
                    f"under, into {store.path}: its --store decides, not the script's "
                    f"store={own}"], result.stderr
    assert not own.exists()
    # A rate the script gave is said whatever it is: the default's own (200) was not
    for run_id, rate in enumerate((500, 200), start=rep.id + 1):
        same = ("import anatomy\n"
                f"anatomy.start(store={str(store.path)!r}, sample_rate={rate}, kernel=False)\n")
        result = _python(store, "-m", "anatomy", "watch", "--", sys.executable, "-c", same)
        assert result.returncode == 0, result.stderr
        assert [line for line in result.stderr.splitlines() if "decides" in line] == [
            f"anatomy: run {run_id} is recorded by the `anatomy watch` this script runs under,"
            f" into {store.path}: its --sample-rate decides, not the script's sample_rate={rate}"]


RUNS_AN_EVALUATION = """
import subprocess, sys
import anatomy

run = anatomy.start(name="trains, then evaluates", kernel=False)
run.phase("training")
run.step(loss=1.0)
evaluation = subprocess.run([sys.executable, "-c", "import anatomy; "
                             "anatomy.start(name='evaluation', kernel=False); raise SystemExit(3)"])
print("the evaluation exited", evaluation.returncode, "and the training goes on")
run.step(loss=0.5)
"""


def test_under_watch_a_subprocess_that_records_itself_and_fails_does_not_fail_the_command(
        store, tmp_path):
    """A watched script that runs an evaluation script (itself calling anatomy.start()) by
    subprocess, which exits 3, and goes on to exit 0: the watch exited 0 and the run said
    "failed: rank 0: the script exited with code 3 (sys.exit)". The command's run completed;
    the subprocess's ending is kept as a warning."""
    script = tmp_path / "train.py"
    script.write_text(RUNS_AN_EVALUATION)
    result = _python(store, "-m", "anatomy", "watch", "--", sys.executable, str(script))
    assert result.returncode == 0, result.stderr
    rep = _only_run(store)
    assert (rep.status, rep.error, rep.steps) == ("completed", None, 2), rep.error
    assert rep.name == "trains, then evaluates"
    [warning] = [m.text for m in store.messages(rep.id) if m.level == "warning"]
    assert "records itself ended failed: the script exited with code 3 (sys.exit); the command" \
           " went on and exited 0" in warning


LOSES_THE_WATCHS_STORE = """
import os, time
import psutil
import anatomy

run = anatomy.start(name="loses the watch's store", kernel=False)
run.phase("training")
store = os.environ["ANATOMY_STORE"]
for name in (store, store + "-wal", store + "-shm"):
    if os.path.exists(name):
        os.remove(name)
time.sleep(3)  # the watch's recording notices the store is gone, and stops
watch = psutil.Process(os.getppid())
before = watch.memory_info().rss
for _ in range(100_000):
    run.step(loss=1.0)
time.sleep(1)
print("the watch grew", (watch.memory_info().rss - before) // 2**20, "MB")
"""


def test_under_watch_marks_after_the_recording_stopped_are_not_held_by_the_watch(
        store, tmp_path):
    """The store deleted under a watched script: the recording stops and the command goes on,
    but the watch put every later mark on a queue nothing drained any more: 168 MB of the
    watch's memory for 300,000 steps, growing until the command ended."""
    script = tmp_path / "train.py"
    script.write_text(LOSES_THE_WATCHS_STORE)
    result = _python(store, "-m", "anatomy", "watch", "--", sys.executable, str(script))
    assert "the training went on unrecorded" in result.stderr, result.stderr
    grew = int(result.stdout.split("the watch grew ")[1].split()[0])
    assert grew < 10, result.stdout  # 55 MB before

"""`anatomy run` with the LoRA targets a user names, as a user runs it: on this CPU the run measures
what `anatomy predict --device cpu` says, to the byte."""

from __future__ import annotations

import json
import subprocess
import sys

from anatomy.analysis.report import report
from anatomy.store import Store

COMPARED = ("weights", "gradients", "optimizer_states", "activations")


def anatomy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anatomy", *args], capture_output=True,
                          text=True, timeout=300)


def test_lora_on_the_token_embeddings_runs_as_predicted(tmp_path):
    """peft's LoRA embedding on tiny-llama's embed_tokens: refused before ("an Embedding: no
    linear or convolution layer"), now trained, its adapters' gradients and states (rank 8 ×
    1,000 tokens and 64 × 8, fp32: 34,048 bytes of gradients) what the prediction says."""
    flags = ["--model", "tiny-llama", "--max-steps", "2", "--lora-rank", "8",
             "--lora-targets", "embed_tokens"]
    store = tmp_path / "runs.sqlite"
    run = anatomy("run", *flags, "--sample-rate", "50", "--store", str(store))
    assert run.returncode == 0, run.stderr
    said = anatomy("predict", *flags, "--device", "cpu", "--json")
    assert said.returncode == 0, said.stderr
    predicted = {k: json.loads(said.stdout)["components"][k] for k in COMPARED}
    measured = {k: getattr(report(Store(store), 1).components, k) for k in COMPARED}
    assert predicted == measured
    assert measured["gradients"] == (8 * 1000 + 64 * 8) * 4
    assert measured["optimizer_states"] == 2 * measured["gradients"]  # AdamW's two moments

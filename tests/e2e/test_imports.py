"""What importing a module loads, in a fresh interpreter: neither torch nor Streamlit where they
are not needed."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import PROJECT


def test_importing_the_module_loads_no_torch():
    code = "import sys, anatomy.analysis.operations; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


def test_the_cli_views_and_analysis_load_without_torch_or_streamlit():
    modules = ["anatomy.cli", "anatomy.views.figures.live", "anatomy.views.figures.compare",
               "anatomy.views.figures.runs", "anatomy.views.figures.anatomy", "anatomy.views.live",
               "anatomy.views.compare", "anatomy.views.anatomy", "anatomy.views.runs",
               "anatomy.views.export", "anatomy.prediction.breakdown", "anatomy.analysis.transfer",
               "anatomy.analysis.sweeps", "anatomy.engine.manager", "anatomy.engine.sweep",
               "anatomy.dashboard"]  # the package names its entry file without Streamlit
    probe = (f"import sys; import {', '.join(modules)}; "
             "print(sorted(m for m in ('torch', 'transformers', 'streamlit') if m in sys.modules))")
    assert _printed(probe)[0] == "[]"


def test_importing_anatomy_loads_neither_torch_nor_the_callback():
    probe = ("import sys, anatomy\n"
             "print(sorted(m for m in ('torch', 'transformers', 'anatomy.engine.callbacks')"
             " if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            cwd=PROJECT, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


def test_the_cli_the_callback_and_the_endpoint_load_no_tracker():
    """A tracker is loaded by whoever asks for it: the Trainer's report_to its integration,
    --metrics-port prometheus-client (when the endpoint starts, not when the module loads)."""
    probe = ("import sys, anatomy, anatomy.cli, anatomy.engine.callbacks, anatomy.engine.prometheus\n"
             "print(sorted(m for m in ('prometheus_client', 'tensorboard', 'mlflow', 'wandb')"
             " if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            cwd=PROJECT, timeout=120)
    assert result.stdout.strip() == "[]", result.stderr


def test_a_cold_prediction_skips_the_trainer_module_and_its_first_recording_is_its_second():
    """`predict` makes the Trainer's optimizer without transformers.trainer (which loads datasets
    and pandas: a second of a cold shell), and what it imports lands before the trace: a
    process's first recording (LoRA: peft) has the same events as its next. (Two frees in a row
    may swap places from one recording to the next, before this change too: compared sorted.)"""
    probe = (
        "import sys\n"
        "from anatomy.analysis import models\n"
        "from anatomy.prediction.tracing.record import record\n"
        "from anatomy.prediction.tracing.trainer_step import StepOptions\n"
        "spec, step = models.resolve('tiny-llama'), StepOptions('bf16', False, 1, 'adamw_torch', 2, 16)\n"
        "first, second = (record(spec, step, kernels='cpu', lora_rank=4) for _ in range(2))\n"
        "print(sorted(first.events) == sorted(second.events), len(first.events) > 100)\n"
        "print(sorted(m for m in ('transformers.trainer', 'datasets', 'pandas') if m in sys.modules))")
    assert _printed(probe)[:2] == ["True True", "[]"]


def test_a_cli_process_indexes_transformers_models_once_and_the_next_reads_the_index(tmp_path):
    """`anatomy`'s processes read transformers' model folders once (analysis/transformers_index.py),
    the next process not at all (the index is kept in the cache folder), and the models load as
    before."""
    probe = (
        "import sys\n"
        "from anatomy.analysis.transformers_index import index_once\n"
        "index_once()\n"
        "from transformers import AutoConfig, LlamaForCausalLM\n"
        "import transformers.models.gpt2 as gpt2\n"
        "from transformers.utils import import_utils\n"
        "print(AutoConfig.for_model('llama').model_type, gpt2.GPT2Config.model_type,\n"
        "      LlamaForCausalLM.__name__)\n"
        "print(import_utils.create_import_structure_from_path.cache_info().misses)")
    env = {**os.environ, "ANATOMY_CACHE": str(tmp_path)}
    first, second = (_printed(probe, env) for _ in range(2))
    assert first[0] == second[0] == "llama gpt2 LlamaForCausalLM"
    assert 500 < int(first[1]) < 1000  # each model folder once
    assert int(second[1]) < 20  # the few folders transformers reads outside its models


def _printed(probe: str, env: dict | None = None) -> list[str]:
    """The lines a fresh interpreter prints running `probe` from the project (it must exit 0)."""
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            cwd=PROJECT, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\n")

"""Models beyond BERT: a preset, a config.json or model folder, or a Hub id in the local cache;
the head follows the architecture; bad configs are refused in one line before anything starts;
LoRA's targets are the model's own modules."""

from __future__ import annotations

import json

import pytest

from anatomy.analysis import models
from anatomy.analysis.models import (
    CAUSAL_LM,
    IMAGE_CLASSIFICATION,
    LINEAR_MODULES,
    LORA_DEFAULT_TARGETS,
    PRESETS,
    SEQUENCE_CLASSIFICATION,
    ModelError,
)
from anatomy.analysis.options import RunOptions, validate

TINY = ("tiny", "tiny-gpt2", "tiny-llama", "tiny-qwen2", "tiny-vit")
# The published models' parameter counts (with the head the task adds: 2 labels for BERT's
# sequence classification, ViT's 1000 ImageNet classes; GPT-2's and Qwen2's LM heads are tied).
PARAMETERS = {
    "bert-large-uncased": 335_143_938,
    "gpt2": 124_439_808,
    "tinyllama-1.1b": 1_100_048_384,
    "qwen2-0.5b": 494_032_768,
    "vit-base-patch16-224": 86_567_656,
}


@pytest.mark.parametrize("name, task", [
    ("bert-large-uncased", SEQUENCE_CLASSIFICATION), ("gpt2", CAUSAL_LM),
    ("tinyllama-1.1b", CAUSAL_LM), ("qwen2-0.5b", CAUSAL_LM),
    ("vit-base-patch16-224", IMAGE_CLASSIFICATION), ("tiny-vit", IMAGE_CLASSIFICATION)])
def test_the_head_follows_the_architecture(name, task):
    assert models.resolve(name).task == task


def test_limits_come_from_each_config():
    assert models.resolve("gpt2").max_positions == 1024  # n_positions
    assert models.resolve("tinyllama-1.1b").max_positions == 2048
    assert models.resolve("qwen2-0.5b").max_positions == 131072
    vit = models.resolve("vit-base-patch16-224")
    assert vit.max_positions is None and vit.image_size == 224 and vit.num_labels == 1000


@pytest.mark.parametrize("name", PARAMETERS)
def test_shipped_configs_build_the_published_models(name):
    model, source = models.build_model(models.resolve(name), "meta", pretrained=False)
    assert sum(p.numel() for p in model.parameters()) == PARAMETERS[name]
    assert all(p.dtype.is_floating_point and p.element_size() == 4 for p in model.parameters())
    assert source == "random (from config)"


def test_a_config_file_and_a_model_folder(tmp_path):
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(models.PRESETS["tiny-llama"].config_path.read_text())
    by_folder = models.resolve(str(folder))
    by_file = models.resolve(str(folder / "config.json"))
    assert by_folder.source == "model folder" and by_file.source == "config file"
    assert by_folder.display_name == by_file.display_name == "my-llama"
    assert by_folder.task == CAUSAL_LM
    assert validate(RunOptions(model=str(folder), seq_len=16), gpu_count=0) == {}


def test_a_hub_id_in_the_local_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    snapshot = tmp_path / "models--someone--small-gpt" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(models.PRESETS["tiny-gpt2"].config_path.read_text())
    (tmp_path / "models--someone--small-gpt" / "refs").mkdir()
    (tmp_path / "models--someone--small-gpt" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    spec = models.resolve("someone/small-gpt")
    assert spec.source == "Hub cache" and spec.hub_id == "someone/small-gpt"
    assert spec.task == CAUSAL_LM and spec.display_name == "someone/small-gpt"
    with pytest.raises(ModelError, match="not in the local Hugging Face cache"):
        models.resolve("someone/elsewhere")


def _write(tmp_path, config) -> str:
    path = tmp_path / "config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return str(path)


LLAMA = json.loads(PRESETS["tiny-llama"].config_path.read_text())


@pytest.mark.parametrize("config, words", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "not a config object"),
    ({k: v for k, v in LLAMA.items() if k != "model_type"}, "has no model_type"),
    ({**LLAMA, "model_type": "llamma"}, "transformers does not know model_type 'llamma'"),
    ({**LLAMA, "hidden_size": 66}, "hidden size 66 is not divisible by the 4 attention heads"),
    ({**LLAMA, "num_hidden_layers": 0}, "num_hidden_layers must be a positive number"),
    ({k: v for k, v in LLAMA.items() if k != "vocab_size"}, "needs a vocab_size"),
])
def test_a_bad_config_is_one_line_naming_what_is_wrong(tmp_path, config, words):
    errors = validate(RunOptions(model=_write(tmp_path, config)), gpu_count=0)
    assert list(errors) == ["model"]
    assert words in errors["model"] and "\n" not in errors["model"]


@pytest.mark.parametrize("model, words", [
    ("nope", "is not a preset"), ("/no/such/config.json", "no such file or folder"),
    ("someone/not-cached", "not in the local Hugging Face cache")])
def test_an_unknown_model_is_refused(model, words):
    assert words in validate(RunOptions(model=model), gpu_count=0)["model"]


def test_validation_knows_each_models_limits():
    assert "1 to 1024" in validate(RunOptions(model="gpt2", seq_len=2048), gpu_count=1)["seq_len"]
    assert validate(RunOptions(model="tinyllama-1.1b", seq_len=2048), gpu_count=1) == {}
    # an image model has no sequence: its length is not judged
    assert validate(RunOptions(model="tiny-vit", seq_len=100_000), gpu_count=0) == {}


@pytest.mark.parametrize("name", TINY)
def test_lora_targets_are_the_models_linear_layers(name):
    spec = models.resolve(name)
    model, _ = models.build_model(spec, "meta", pretrained=False)
    linear = {n.split(".")[-1] for n, m in model.named_modules()
              if type(m).__name__ in ("Linear", "Conv1D")} - {"classifier", "lm_head"}
    assert linear == set(LINEAR_MODULES[spec.model_type])
    assert set(LORA_DEFAULT_TARGETS[spec.model_type]) <= linear
    lora, _ = models.build_model(spec, "meta", lora_rank=4, pretrained=False)
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or "classifier" in n for n in trainable)


def test_lora_defaults_agree_with_peft():
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as peft

    for model_type, targets in LORA_DEFAULT_TARGETS.items():
        if model_type in peft:
            assert list(targets) == peft[model_type]


def test_lora_options_are_checked():
    assert "set a LoRA rank" in validate(RunOptions(lora_targets="q_proj"), 0)["lora_targets"]
    errors = validate(RunOptions(model="tiny-llama", lora_rank=4, lora_targets="query"), 0)
    assert "query is not a module of tiny-llama" in errors["lora_targets"]
    assert validate(RunOptions(model="tiny-llama", lora_rank=4, lora_targets="q_proj,o_proj"),
                    0) == {}
    assert "not a module name" in validate(RunOptions(lora_rank=4, lora_targets="q-proj"),
                                           0)["lora_targets"]

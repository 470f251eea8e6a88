"""Models beyond BERT: a preset, a config.json or model folder, or a Hub id in the local cache;
the head follows the architecture; bad configs are refused in one line before anything starts;
LoRA's targets are the model's own modules."""

from __future__ import annotations

import importlib.util
import json
import re
import warnings

import pytest

from anatomy.analysis import models
from anatomy.analysis.models import (
    CAUSAL_LM,
    IMAGE_CLASSIFICATION,
    PRESETS,
    SEQ2SEQ,
    SEQUENCE_CLASSIFICATION,
    TOKEN_CLASSIFICATION,
    ModelError,
)
from anatomy.analysis.options import RunOptions, validate
from tests.conftest import PROJECT, small_ner_config
from tests.helpers import skip_unknown_model_types, transformers_below

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


@pytest.mark.parametrize("weights", ["model.safetensors", "model-00001-of-00002.safetensors",
                                     "pytorch_model.bin"])
def test_a_folder_that_holds_weights_is_known_to_hold_them(tmp_path, weights):
    """A user's checkpoint folder: a run trains random weights of its config (the same memory),
    and said nothing of the weights beside it."""
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(models.PRESETS["tiny-llama"].config_path.read_text())
    assert models.unread_weights(models.resolve(str(folder))) is None
    (folder / weights).write_bytes(b"")
    assert models.unread_weights(models.resolve(str(folder))) == weights
    # A config file named alone is no folder of weights; nor is a preset
    assert models.unread_weights(models.resolve(str(folder / "config.json"))) is None
    assert models.unread_weights(models.resolve("tiny-llama")) is None


def test_a_folder_named_as_a_preset_is_the_folder_as_transformers_reads_it(tmp_path,
                                                                            monkeypatch):
    """`save_pretrained("gpt2")` of a user's small GPT-2, then `--model gpt2` beside it: it was
    the shipped 124 M parameter preset (2.1 GiB predicted for a 5 MiB model), where
    `from_pretrained("gpt2")` reads the folder. A folder of that name without a config is no
    model: the preset still."""
    from transformers import GPT2Config

    monkeypatch.chdir(tmp_path)
    GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=1000, n_positions=256,
               architectures=["GPT2LMHeadModel"]).save_pretrained("gpt2")
    mine = models.resolve("gpt2")
    assert (mine.source, mine.config["n_embd"]) == ("model folder", 64)
    # the run stores it by its path, as any folder's (run again from elsewhere: the same model)
    assert RunOptions(model="gpt2").located().model == str(tmp_path / "gpt2")
    (tmp_path / "tiny").mkdir()
    assert models.resolve("tiny").source == "preset"
    assert RunOptions(model="tiny").located().model == "tiny"


@pytest.mark.parametrize("name, shown", [
    ("Meta-Llama-3.1-8B-Instruct", "Meta-Llama-3.1-8B-Instruct"), ("Qwen2.5-0.5B", "Qwen2.5-0.5B"),
    ("Qwen2.5-0.5B/config.json", "Qwen2.5-0.5B"), ("phi-3.5.json", "phi-3.5")])
def test_a_model_is_shown_by_its_folders_whole_name(tmp_path, name, shown):
    """A folder named as its Hub repository was shown cut at its first dot ("Meta-Llama-3")."""
    config = models.PRESETS["tiny-llama"].config_path.read_text()
    path = tmp_path / name
    if name.endswith(".json"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(config)
    else:
        path.mkdir()
        (path / "config.json").write_text(config)
    assert models.resolve(str(path)).display_name == shown


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
    # a model of its own code (InternLM2's): what the refusal's cause is
    ({**LLAMA, "model_type": "internlm2", "auto_map": {
        "AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"}},
     "'internlm2': its config's auto_map names the model's own code, which anatomy does not run "
     "(trust_remote_code)"),
    ({**LLAMA, "hidden_size": 66}, "hidden size 66 is not divisible by the 4 attention heads"),
    # a config class's default key-value heads left beside fewer query heads (Qwen2's 32 under
    # 4): the forward pass stopped, "The size of tensor a (4) must match the size of tensor b"
    ({**LLAMA, "num_key_value_heads": 32}, "num_attention_heads 4 is not divisible by "
     "num_key_value_heads 32 (each key-value head serves a whole number of query heads: set "
     "num_key_value_heads to a divisor of 4)"),
    ({**LLAMA, "text_config": {"num_attention_heads": 4, "num_key_value_heads": 3}},
     "text_config.num_attention_heads 4 is not divisible by text_config.num_key_value_heads 3"),
    ({**LLAMA, "num_hidden_layers": 0}, "num_hidden_layers must be a positive number"),
    ({**LLAMA, "hidden_size": 128.5}, "hidden_size must be a whole number, got 128.5"),
    ({**LLAMA, "num_hidden_layers": "2"}, "num_hidden_layers must be a whole number, got '2'"),
    ({**LLAMA, "hidden_size": 10**30}, "its sizes make about 10^"),
    ({**LLAMA, "num_hidden_layers": 1_000_000}, "1,000,000 layers are more than anatomy follows"),
    ({**LLAMA, "text_config": {"hidden_size": True}}, "text_config.hidden_size must be a whole"),
    ({"model_type": "clip", "architectures": ["CLIPModel"], "text_config": {},
      "vision_config": {}}, "CLIPModel is a model of 2 towers"),
    # a head of another task: the type's causal-LM head was trained in its place, silently
    ({**LLAMA, "architectures": ["LlamaForQuestionAnswering"]},
     "a question answering head: anatomy trains causal-LM (a vision-language model's on text), "
     'sequence-classification, token-classification, image-classification and '
     'sequence-to-sequence heads (architectures: ["LlamaForSequenceClassification"] predicts the '
     'same body with one)'),
    ({**PRESETS["tiny"].config_dict(), "architectures": ["BertForMultipleChoice"]},
     "BertForMultipleChoice is a multiple choice head"),
    # its name ends as a text classifier's, but it classifies audio: "no sequence
    # classification head for Wav2Vec2Config"
    ({"model_type": "wav2vec2", "architectures": ["Wav2Vec2ForSequenceClassification"]},
     "Wav2Vec2ForSequenceClassification is an audio classification head"),
    # a classifier of no classes: transformers builds none, or one of no outputs
    ({**small_ner_config(), "num_labels": 0},
     "num_labels must be 1 to 1,000,000 for token classification (the classes its head scores), "
     "got 0"),
    ({**PRESETS["tiny"].config_dict(), "num_labels": -2},
     "num_labels must be 1 to 1,000,000 for sequence classification"),
    # transformers' config names every label: a trillion hung the check for hours
    ({**small_ner_config(), "num_labels": 10**12}, "got 1,000,000,000,000"),
])
def test_a_bad_config_is_one_line_naming_what_is_wrong(tmp_path, config, words):
    errors = validate(RunOptions(model=_write(tmp_path, config)), gpu_count=0)
    assert list(errors) == ["model"]
    assert words in errors["model"] and "\n" not in errors["model"]


@pytest.mark.parametrize("content, words", [
    (b"\x89safetensors\xff\x00", "is not UTF-8 text (byte 0), not a config.json (a weights file?)"),
    (b"[" * 100_000, "is nested too deeply to be a config"),
    (b'{"hidden_size": ' + b"9" * 5000 + b"}", "a number of more digits than Python reads"),
    (None, "is 17 MiB, not a config.json (a weights file?)"),
])
def test_a_file_that_is_no_config_is_one_line_not_a_traceback(tmp_path, content, words):
    """A weights file named by mistake (`--model model.safetensors`) was a UnicodeDecodeError
    traceback, and a multi-GB one was read whole first."""
    path = tmp_path / "model.safetensors"
    if content is None:
        with open(path, "wb") as out:
            out.truncate(17 * 2**20)
    else:
        path.write_bytes(content)
    errors = validate(RunOptions(model=str(path)), gpu_count=0)
    assert list(errors) == ["model"]
    assert words in errors["model"] and "\n" not in errors["model"], errors["model"]


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
def test_lora_targets_are_the_models_own_layers(name):
    spec = models.resolve(name)
    model, _ = models.build_model(spec, "meta", pretrained=False)
    linear = {n.split(".")[-1] for n, m in model.named_modules()
              if type(m).__name__ in ("Linear", "Conv1D")} - {"classifier", "lm_head"}
    assert linear <= set(models.linear_module_names(spec))
    assert set(models.default_lora_targets(spec)) <= set(models.linear_module_names(spec))
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        lora, _ = models.build_model(spec, "meta", lora_rank=4, pretrained=False)
    # Every LoRA run printed transformers' FutureWarning about a call peft makes.
    assert not [w for w in warned if "is_gradient_checkpointing" in str(w.message)]
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or "classifier" in n for n in trainable)


def test_lora_defaults_are_peft_s_where_peft_has_them():
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as peft

    for name in ("tiny", "tiny-gpt2", "tiny-llama", "tiny-qwen2"):
        spec = models.resolve(name)
        assert list(models.default_lora_targets(spec)) == peft[spec.model_type]


def _config_file(tmp_path, model_type: str) -> str:
    """A model type's own defaults, small, as a config.json (bench/architectures.py's)."""
    from bench.architectures import architectures, working_config

    return str(working_config(model_type, dict(architectures())[model_type], tmp_path)[0])


@pytest.mark.parametrize("model_type, targets", [
    ("phi3", ("qkv_proj",)),  # fused query-key-value
    ("olmo", ("q_proj", "v_proj")), ("cohere", ("q_proj", "v_proj")),
    ("granite", ("q_proj", "v_proj")), ("starcoder2", ("q_proj", "v_proj")),
    ("smollm3", ("q_proj", "v_proj")), ("qwen2_moe", ("q_proj", "v_proj")),
    ("vit", ("q_proj", "v_proj")),
    ("gemma4", ("q_proj", "v_proj"))])  # peft's is a pattern, which a list of names cannot hold
def test_lora_defaults_come_from_the_models_own_attention(tmp_path, model_type, targets):
    spec = models.resolve(_config_file(tmp_path, model_type))
    assert models.default_lora_targets(spec) == targets
    assert validate(RunOptions(model=spec.name, lora_rank=4, seq_len=16), gpu_count=0) == {}


def test_lora_defaults_name_no_module_peft_cannot_wrap(tmp_path):
    """A convolution network without attention: every layer but the head's. ConvNeXt's
    downsampling layer is called "1", as its second stage is: a target "1" made peft refuse the
    stage, so those are named in full."""
    spec = models.resolve(_config_file(tmp_path, "convnext"))
    targets = models.default_lora_targets(spec)
    assert "1" not in targets and any(t.endswith("downsampling_layer.1") for t in targets)
    lora, _ = models.build_model(spec, "meta", lora_rank=4, pretrained=False)
    assert any("lora_" in n for n, p in lora.named_parameters() if p.requires_grad)


def test_lora_defaults_leave_out_the_layers_peft_refuses(tmp_path):
    """A Mamba model (no attention: every linear layer) with no targets named: peft refuses
    LoRA on a Mamba mixer's out_proj, and `--lora-rank 8` alone was refused with peft's "Please
    remove it from `target_modules`", of targets the user never named. The default now leaves
    out what peft refuses, and the model trains its adapters on the rest."""
    from transformers import AutoConfig

    AutoConfig.for_model("mamba", hidden_size=64, num_hidden_layers=2, vocab_size=1000,
                         state_size=8).save_pretrained(tmp_path / "mamba")
    spec = models.resolve(str(tmp_path / "mamba"))
    targets = models.default_lora_targets(spec)
    assert "out_proj" not in targets and "in_proj" in targets
    assert validate(RunOptions(model=spec.name, lora_rank=8, seq_len=16), gpu_count=0) == {}
    lora, _ = models.build_model(spec, "meta", lora_rank=8, pretrained=False)
    assert any("lora_" in n for n, p in lora.named_parameters() if p.requires_grad)


def _saved(tmp_path, model_type: str, **sizes) -> str:
    """A model folder as a user has it: the type's config, small, written by save_pretrained."""
    from transformers import AutoConfig

    AutoConfig.for_model(model_type, **sizes).save_pretrained(tmp_path / model_type)
    return str(tmp_path / model_type)


def _adapted(model) -> set[str]:
    """The modules peft put adapters on."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return {n for n, m in model.named_modules() if isinstance(m, BaseTunerLayer)}


def test_a_model_without_a_layer_for_adapters_is_refused_in_anatomy_s_words(tmp_path):
    """IBERT's layers are its own QuantLinear, none of the torch layers peft wraps, and its only
    linear layers lie in its classifier, which peft's sequence classification trains whole
    (modules_to_save): anatomy's default target, classifier.dense, was left out by peft, and
    `--lora-rank 8` was refused with peft's "No modules were targeted for adaptation … You may
    also have only targeted modules that are marked to be saved", of a target anatomy chose."""
    name = _saved(tmp_path, "ibert", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                  intermediate_size=128, vocab_size=1000)
    said = ("lora: ibert has no linear or convolution layer for LoRA's adapters: its QuantLinear "
            "layers are none of the torch layers peft wraps, and classifier.dense lies in "
            "classifier, a module peft trains whole beside the adapters for sequence "
            "classification (train it without a LoRA rank)")
    for targets in ("", "all-linear", "dense"):
        assert validate(RunOptions(model=name, lora_rank=8, lora_targets=targets, seq_len=16),
                        0) == {"model": said}
    with pytest.raises(ModelError, match=r"^lora: ibert has no linear or convolution layer"):
        models.build_model(models.resolve(name), "meta", lora_rank=8, pretrained=False)
    assert validate(RunOptions(model=name, seq_len=16), 0) == {}


def test_the_token_coverage_table_says_of_ibert_s_lora_what_anatomy_says(tmp_path):
    """docs/COVERAGE-TOKENS.md's H200 LoRA cell for IBERT's token classifier held an older,
    shorter refusal ("… for LoRA's adapters", without why): the cell is the bench's, of the
    bench's own config, as the options' check answers it now."""
    from bench.architectures import MODES, _cell, _options, _predict, working_config

    path, _, _ = working_config("ibert", "IBertForTokenClassification", tmp_path)
    changes = next(changes for name, _, changes in MODES if name == "h200 lora")
    said = _cell(_predict(_options(path, **changes), "cuda"))
    assert said.startswith("refused: lora: ibert has no linear or convolution layer for LoRA's "
                           "adapters: its QuantLinear layers are none of the torch layers peft")
    rows = (PROJECT / "docs" / "COVERAGE-TOKENS.md").read_text().splitlines()
    row = next(line for line in rows if line.startswith("| ibert | IBertForTokenClassification |"))
    assert row.split(" | ")[6] == said


def test_all_linear_leaves_out_what_peft_s_classification_trains_whole(tmp_path):
    """peft's sequence classification trains whole every module whose name ends in classifier
    (DistilBERT's pre_classifier as well as its classifier), and its all-linear put an adapter
    on pre_classifier too: `--lora-targets all-linear` was refused with "cannot predict
    distilbert: modules_to_save cannot be applied to modules of type <class
    'peft.tuners.lora.layer.Linear'>". It trains whole, as peft has it; naming it says so."""
    name = _saved(tmp_path, "distilbert", n_layers=2, dim=64, n_heads=4, hidden_dim=128,
                  vocab_size=1000)
    assert validate(RunOptions(model=name, lora_rank=8, lora_targets="all-linear", seq_len=16),
                    0) == {}
    spec = models.resolve(name)
    lora, _ = models.build_model(spec, "meta", lora_rank=8, lora_targets=(models.ALL_LINEAR,),
                                 pretrained=False)
    adapted = _adapted(lora)
    assert any(n.endswith("attention.q_lin") for n in adapted)
    assert not any("classifier" in n for n in adapted)
    assert any("pre_classifier" in n for n, p in lora.named_parameters() if p.requires_grad)
    errors = validate(RunOptions(model=name, lora_rank=8, lora_targets="pre_classifier"), 0)
    assert errors["lora_targets"].startswith(
        "lora_targets: pre_classifier names pre_classifier of distilbert: it is a module peft "
        "trains whole beside the adapters for sequence classification (the layers LoRA can "
        "adapt: q_lin, k_lin, v_lin, out_lin, lin1, lin2, word_embeddings, "
        "position_embeddings)")


@pytest.mark.parametrize("model_type, sizes", [
    ("mamba", {}), ("falcon_mamba", {}),
    ("mamba2", {"num_heads": 4, "head_dim": 32, "n_groups": 1})])
def test_all_linear_leaves_out_the_layers_peft_refuses(tmp_path, model_type, sizes):
    """`--lora-targets all-linear` on a Mamba model was refused with peft's "Module 'out_proj'
    is incompatible with Mamba-based models … Please remove it from `target_modules`", a name
    the user never wrote: peft's all-linear holds every linear layer but the output, and then
    refuses a Mamba mixer's out_proj. It now means what peft can adapt of them; naming out_proj
    (or conv1d) says in anatomy's words that peft refuses it, and what LoRA can adapt."""
    name = _saved(tmp_path, model_type, num_hidden_layers=2, hidden_size=64, vocab_size=1000,
                  **sizes)
    assert validate(RunOptions(model=name, lora_rank=8, lora_targets="all-linear", seq_len=16),
                    0) == {}
    lora, _ = models.build_model(models.resolve(name), "meta", lora_rank=8,
                                 lora_targets=(models.ALL_LINEAR,), pretrained=False)
    adapted = {n.rsplit(".", 1)[-1] for n in _adapted(lora)}
    assert "in_proj" in adapted and not adapted & {"out_proj", "conv1d", "lm_head"}
    for target in ("out_proj", "mixer.conv1d"):
        words = validate(RunOptions(model=name, lora_rank=8, lora_targets=target), 0)
        layer = f"backbone.layers.0.mixer.{target.split('.')[-1]}"
        assert words["lora_targets"].startswith(
            f"lora_targets: {target} names {layer} of {model_type}: it is a layer peft's LoRA "
            f"refuses in {model_type} models (the layers LoRA can adapt: in_proj")


def test_all_linear_on_a_model_of_convolutions_says_what_to_name(tmp_path):
    """peft's all-linear wraps linear layers alone, and a ResNet's only one is its head's output
    layer, which trains whole: `--lora-targets all-linear` was refused with peft's "No modules
    were targeted for adaptation … only targeted modules that are marked to be saved"."""
    name = _saved(tmp_path, "resnet", depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 64, 128],
                  embedding_size=16)
    words = ("lora_targets: all-linear adapts linear layers, and resnet has none but "
             "classifier.1, which LoRA never adapts: name its convolution layers instead")
    assert validate(RunOptions(model=name, lora_rank=8, lora_targets="all-linear"), 0) == \
        {"lora_targets": f"{words} (the layers LoRA can adapt: convolution)"}
    spec = models.resolve(name)
    with pytest.raises(ModelError, match=re.escape(words)):
        models.build_model(spec, "meta", lora_rank=8, lora_targets=(models.ALL_LINEAR,),
                           pretrained=False)
    assert validate(RunOptions(model=name, lora_rank=8, lora_targets="convolution"), 0) == {}


def test_grouped_convolutions_named_at_a_rank_their_groups_do_not_divide_say_so(tmp_path):
    """peft adapts a grouped (depthwise) convolution only at a rank its groups divide:
    `--lora-targets dwconv` on a ConvNeXt at rank 8 was refused with peft's "Targeting a Conv2d
    with groups=16 and rank 8. Currently, support is limited to …", after the run had started."""
    name = _saved(tmp_path, "convnext", depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 64, 128],
                  image_size=32)
    spec = models.resolve(name)
    words = ("lora_targets: dwconv of convnext are grouped convolutions (groups 16 to 128): peft "
             "adapts them only at a rank their groups divide, a multiple of 128, and 8 is not "
             "(or leave dwconv out; the other layers LoRA can adapt: patch_embeddings, pwconv1, "
             "pwconv2, 1)")
    with pytest.raises(ModelError, match=re.escape(words)):
        models.build_model(spec, "meta", lora_rank=8, lora_targets=("dwconv", "pwconv1"),
                           pretrained=False)
    assert models.rank_problem(spec, 8, ("dwconv", "pwconv1")) == words
    # refused before anything starts, as every option is
    assert validate(RunOptions(model=name, lora_rank=8, lora_targets="dwconv,pwconv1"), 0) == \
        {"lora_targets": words}
    assert models.rank_problem(spec, 8, ("pwconv1",)) is None
    assert models.rank_problem(spec, 128, ("dwconv",)) is None
    lora, _ = models.build_model(spec, "meta", lora_rank=128, lora_targets=("dwconv",),
                                 pretrained=False)
    assert any(n.endswith("dwconv") for n in _adapted(lora))


def test_a_layer_whose_model_reads_what_peft_s_wrapper_hides_is_no_lora_target(tmp_path):
    """peft's LoRA wrapper of a convolution passes on its weight and bias, not its stride:
    Whisper's encoder reads its conv1's and conv2's stride in its forward, and `--lora-targets
    conv1` was refused only by the trace ("cannot predict whisper: … WhisperEncoder.forward:
    'Conv1d' object has no attribute 'stride'"), listed among the layers LoRA can adapt, and a
    run would start and fail. It is refused before anything starts, and never offered."""
    name = _saved(tmp_path, "whisper", d_model=64, encoder_layers=1, decoder_layers=1,
                  encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                  decoder_ffn_dim=64)
    spec = models.resolve(name)
    said = ("lora_targets: conv1 names model.encoder.conv1 of whisper: it is a Conv1d whose "
            "stride WhisperEncoder reads, which peft's LoRA wrapper of it does not pass on (the "
            "layers LoRA can adapt: k_proj, v_proj, q_proj, out_proj, fc1, fc2, embed_tokens)")
    assert validate(RunOptions(model=name, lora_rank=8, lora_targets="conv1",
                             seq_len=16), 0) == \
        {"lora_targets": said}
    errors = validate(RunOptions(model=name, lora_rank=8, lora_targets="q_proj,conv2",
                                 seq_len=16), 0)
    assert errors["lora_targets"].startswith("lora_targets: conv2 names model.encoder.conv2 of "
                                             "whisper: it is a Conv1d whose stride")
    assert not {"conv1", "conv2"} & set(models.linear_module_names(spec))
    with pytest.raises(ModelError, match=re.escape(said.split(" (the layers")[0])):
        models.build_model(spec, "meta", lora_rank=8, lora_targets=("conv1",), pretrained=False)
    assert validate(RunOptions(model=name, lora_rank=8, lora_targets="q_proj,fc1",
                             seq_len=16), 0) == {}

def test_an_embedding_named_is_a_lora_target(tmp_path):
    """peft's LoRA adapts an nn.Embedding (its adapters lora_embedding_A and _B): `--lora-targets
    embed_tokens` was refused ("an Embedding: no linear or convolution layer"). It trains the
    embedding's adapters alone; the defaults stay peft's (no embedding), and an embedding whose
    forward is its own (Whisper's positions, a lookup of offsets, not of the input, which peft's
    embedding adds to) is refused in words."""
    import math

    import torch

    spec = models.resolve("tiny-llama")
    assert validate(RunOptions(model="tiny-llama", lora_rank=4, lora_targets="embed_tokens"),
                    0) == {}
    assert models.linear_module_names(spec)[-1] == "embed_tokens"  # offered, last
    assert "embed_tokens" not in models.default_lora_targets(spec)
    # built where the run builds it (allocated, given values later): its adapters get peft's
    # values (A zeros, B normal), not whatever the allocation held
    model, _ = models.build_model(spec, "cpu", lora_rank=4, lora_targets=("embed_tokens",),
                                  pretrained=False, initialise=False)
    embedding = model.get_submodule("base_model.model.model.embed_tokens")
    for parameter in (*embedding.lora_embedding_A.values(), *embedding.lora_embedding_B.values()):
        parameter.data.fill_(math.nan)
    models.initialise(model)
    a, b = embedding.lora_embedding_A["default"], embedding.lora_embedding_B["default"]
    assert a.requires_grad and b.requires_grad and not embedding.base_layer.weight.requires_grad
    assert torch.count_nonzero(a) == 0 and torch.isfinite(b).all() and b.std() > 0.5
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        "base_model.model.model.embed_tokens.lora_embedding_A.default",
        "base_model.model.model.embed_tokens.lora_embedding_B.default"}

    name = _saved(tmp_path, "whisper", d_model=64, encoder_layers=1, decoder_layers=1,
                  encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                  decoder_ffn_dim=64)
    errors = validate(RunOptions(model=name, lora_rank=8, lora_targets="decoder.embed_positions",
                                 seq_len=16), 0)
    assert errors["lora_targets"].startswith(
        "lora_targets: decoder.embed_positions names model.decoder.embed_positions of whisper: it "
        "is a WhisperPositionalEmbedding, an embedding with a forward of its own, which peft's "
        "LoRA embedding does not follow")
    # the encoder's is a plain one, but the encoder reads its size, which peft's wrapper hides
    errors = validate(RunOptions(model=name, lora_rank=8, lora_targets="encoder.embed_positions",
                                 seq_len=16), 0)
    assert errors["lora_targets"].startswith(
        "lora_targets: encoder.embed_positions names model.encoder.embed_positions of whisper: it "
        "is an Embedding whose num_embeddings WhisperEncoder reads, which peft's LoRA wrapper of "
        "it does not pass on")
    assert validate(RunOptions(model=name, lora_rank=8, lora_targets="embed_tokens",
                               seq_len=16), 0) == {}
    # Gemma's scales its lookup of the input in a forward of its own: adapted, as peft has it
    gemma = _saved(tmp_path, "gemma2", hidden_size=64, intermediate_size=128,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=16, vocab_size=1000)
    assert validate(RunOptions(model=gemma, lora_rank=8, lora_targets="embed_tokens",
                               seq_len=16), 0) == {}
    # T5's shared holds the weight its encoder and decoder look up through their embed_tokens:
    # called by no forward, its adapters never were ("cannot predict t5: element 0 of tensors
    # does not require grad")
    t5 = _saved(tmp_path, "t5", d_model=64, d_kv=16, d_ff=128, num_layers=1, num_heads=4,
                vocab_size=1000)
    assert validate(RunOptions(model=t5, lora_rank=8, lora_targets="shared", seq_len=16),
                    0)["lora_targets"].startswith(
        "lora_targets: shared names shared of t5: it shares its weight with encoder.embed_tokens,"
        " decoder.embed_tokens, which the model looks its tokens up through instead: adapters "
        "on it would never be used (the layers LoRA can adapt: q, k, v, o, wi, wo, embed_tokens")
    assert validate(RunOptions(model=t5, lora_rank=8, lora_targets="embed_tokens", seq_len=16),
                    0) == {}


def test_what_a_model_writes_of_a_layer_is_no_read_peft_s_wrapper_hides(tmp_path):
    """T5Gemma's set_output_embeddings sets its decoder's embed_tokens.num_embeddings, which no
    training runs and no forward reads: embed_tokens was refused as an Embedding "whose
    num_embeddings T5GemmaForConditionalGeneration reads"."""
    name = _config_file(tmp_path, "t5gemma")
    assert validate(RunOptions(model=name, lora_rank=8, lora_targets="embed_tokens",
                               seq_len=16), 0) == {}
    assert "embed_tokens" in models.linear_module_names(models.resolve(name))


def test_the_head_and_task_come_from_transformers_tables(tmp_path):
    t5 = models.resolve(_config_file(tmp_path, "t5"))
    assert (t5.task, t5.head) == (SEQ2SEQ, "T5ForConditionalGeneration")
    whisper = models.resolve(_config_file(tmp_path, "whisper"))
    assert whisper.task == SEQ2SEQ and whisper.audio_features(64) == (80, 3000)
    resnet = models.resolve(_config_file(tmp_path, "resnet"))
    assert resnet.task == IMAGE_CLASSIFICATION and resnet.image_size == 224  # none in its config
    # a model type without architectures: transformers' first table with it
    assert models.task_of({"model_type": "llama"}) == CAUSAL_LM
    assert models.task_of({"model_type": "bert"}) == SEQUENCE_CLASSIFICATION  # an encoder
    assert models.task_of({"model_type": "bart"}) == SEQ2SEQ
    # an audio LM in the sequence-to-sequence table, but no encoder-decoder: its text is a causal LM
    assert models.task_of({"model_type": "qwen2_audio", "text_config": {},
                           "audio_config": {}}) == CAUSAL_LM


def test_a_two_tower_classifier_takes_its_images_at_its_vision_towers_size(tmp_path):
    """CLIP and SigLIP name their image size in `vision_config` alone (clip-vit-large-patch14-336:
    336): the images were the 224 default, and the prediction refused "Input image size
    (224*224) doesn't match model (336*336)"."""
    import transformers

    from anatomy.analysis import dummy_data

    tower = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=64)
    transformers.CLIPConfig(text_config=tower, vision_config=dict(
        tower, image_size=336, patch_size=14, num_channels=1)).save_pretrained(tmp_path)
    clip = models.resolve(str(tmp_path))
    assert (clip.task, clip.image_size, clip.num_channels) == (IMAGE_CLASSIFICATION, 336, 1)
    assert dummy_data.sample(clip, 16).words == "images 336×336"


@pytest.mark.parametrize("model_type, sizes, architecture", [
    ("wav2vec2", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=128, vocab_size=32), "Wav2Vec2Model"),
    ("clip_text_model", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=128, vocab_size=1000), "CLIPTextModel")])
def test_a_model_type_without_a_trained_head_is_refused_in_words(tmp_path, model_type, sizes,
                                                                  architecture):
    """A bare audio encoder or text tower, saved as save_pretrained writes it, with or without
    its architecture: "transformers has no sequence classification head for Wav2Vec2Config" —
    a task the user never asked for, and false of wav2vec2 (whose sequence classifier is an audio
    one). Now the line says that transformers has no head of the tasks anatomy trains for the
    type, and names those tasks."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type, **sizes)
    config.save_pretrained(tmp_path / "bare")
    config.architectures = [architecture]
    config.save_pretrained(tmp_path / "named")
    for folder in ("bare", "named"):
        error = validate(RunOptions(model=str(tmp_path / folder), seq_len=16), 0)["model"]
        assert error.startswith(f"model: transformers has no head of the tasks anatomy trains "
                                f"for {model_type} ({type(config).__name__}): anatomy trains "
                                "causal-LM"), error
        assert "\n" not in error


def test_a_vision_language_model_trains_its_text_alone(tmp_path):
    """LLaVA's, Qwen2.5-VL's, Mistral 3's heads are in transformers' image-text-to-text table
    alone: "transformers has no sequence classification head for LlavaConfig". They train as
    causal LMs on text (their image is optional), the dummy tokens below the image token, and the
    words say that no gradient reaches the vision tower."""
    import transformers

    from anatomy.analysis import dummy_data

    text = dict(model_type="llama", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=64, vocab_size=1000)
    vision = dict(model_type="clip_vision_model", hidden_size=32, num_hidden_layers=1,
                  num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8)
    config = transformers.LlavaConfig(text_config=text, vision_config=vision,
                                      image_token_index=900)
    config.architectures = ["LlavaForConditionalGeneration"]
    config.save_pretrained(tmp_path)
    llava = models.resolve(str(tmp_path))
    assert (llava.task, llava.head) == (CAUSAL_LM, "LlavaForConditionalGeneration")
    assert models.token_range(llava) == (100, 900)  # the image token is 900, the vocabulary 1,000
    assert dummy_data.sample(llava, 16).words == (
        "sequence length 16, text alone (no image: no gradient reaches its vision tower)")


def test_the_dummy_tokens_are_within_every_vocabulary_the_model_has(tmp_path):
    """FSMT names no vocab_size, only a source's and a target's: its tokens (the walkthrough's
    up to 30,000) went past both, and the run failed where the prediction held."""
    fsmt = models.resolve(_config_file(tmp_path, "fsmt"))
    assert models.token_range(fsmt)[1] <= min(fsmt.config["src_vocab_size"],
                                               fsmt.config["tgt_vocab_size"])


def test_checkpointing_is_refused_where_the_model_has_none(tmp_path):
    model = _config_file(tmp_path, "resnet")
    errors = validate(RunOptions(model=model, gradient_checkpointing=True), gpu_count=0)
    assert list(errors) == ["gradient_checkpointing"]
    assert "cannot recompute its activations" in errors["gradient_checkpointing"]
    assert validate(RunOptions(model=model), gpu_count=0) == {}


def test_eager_attention_is_refused_where_the_model_has_no_other(tmp_path):
    """A ResNet has no attention: eager was accepted and changed nothing, the run and its
    prediction said "eager attention" of a model without any."""
    model = _config_file(tmp_path, "resnet")
    errors = validate(RunOptions(model=model, attention="eager"), gpu_count=0)
    assert errors == {"attention": "attention: resnet (ResNetForImageClassification) has no "
                                    "sdpa attention that eager would replace: it would change "
                                    "nothing (leave it sdpa)"}
    assert validate(RunOptions(model="tiny-llama", attention="eager"), gpu_count=0) == {}


def test_a_long_model_name_is_one_line():
    errors = validate(RunOptions(model="x" * 5000), gpu_count=0)
    assert list(errors) == ["model"] and "5,000 characters" in errors["model"]
    errors = validate(RunOptions(model="a/" + "b" * 300 + ".json"), gpu_count=0)
    assert list(errors) == ["model"] and "\n" not in errors["model"]



@pytest.mark.parametrize("command", ["run", "predict", "sweep"])
def test_the_lora_targets_help_shows_the_form_the_parser_takes(command):
    """`--lora-targets`' help said comma-separated while the parser takes names apart (nargs)."""
    import re

    from anatomy.cli import parser
    from anatomy.cli.arguments import values_from_args

    sub = next(a for a in parser()._actions if a.dest == "command").choices[command]
    (action,) = [a for a in sub._actions if "--lora-targets" in a.option_strings]
    assert "comma" not in action.help
    example = re.search(r"--lora-targets((?: [a-z_.]+)+)", action.help)
    assert example, action.help
    args = sub.parse_args(["--lora-rank", "4", "--lora-targets", *example[1].split()])
    assert RunOptions.read(values_from_args(args, has_gpu=False)).lora_targets == \
        tuple(example[1].split())

def test_lora_options_are_checked():
    assert "set a LoRA rank" in validate({"lora_targets": "q_proj"}, 0)["lora_targets"]
    errors = validate(RunOptions(model="tiny-llama", lora_rank=4, lora_targets="query"), 0)
    assert "query names no module of tiny-llama" in errors["lora_targets"]
    assert "(the layers LoRA can adapt: q_proj, k_proj, v_proj, o_proj" in errors["lora_targets"]
    errors = validate(RunOptions(model="tiny", lora_rank=4, lora_targets="nonexistent.query"), 0)
    assert "nonexistent.query names no module" in errors["lora_targets"]
    # What a target names when it is no layer LoRA adapts (it said "matches no linear layer" of
    # tiny's classifier, a linear layer): the head's output layer, another kind of module.
    errors = validate(RunOptions(model="tiny", lora_rank=4, lora_targets="classifier"), 0)
    assert errors["lora_targets"].startswith(
        "lora_targets: classifier is the output layer of tiny's head (classifier), which trains"
        " whole beside the adapters, never adapted (the layers LoRA can adapt: query, key")
    errors = validate(RunOptions(model="tiny", lora_rank=4, lora_targets="attention"), 0)
    assert errors["lora_targets"].startswith(
        "lora_targets: attention names bert.encoder.layer.0.attention of tiny, a BertAttention: "
        "no linear, convolution or embedding layer")
    # "a LayerNorm", "an Embedding": the article follows the class's name
    errors = validate(RunOptions(model="tiny", lora_rank=4, lora_targets="embeddings.LayerNorm"),
                      0)
    assert errors["lora_targets"].startswith(
        "lora_targets: embeddings.LayerNorm names bert.embeddings.LayerNorm of tiny, a LayerNorm: "
        "no linear, convolution or embedding layer")
    assert validate(RunOptions(model="tiny", lora_rank=4, lora_targets="attention.self.query"),
                    0) == {}
    assert validate(RunOptions(model="tiny-llama", lora_rank=4, lora_targets="q_proj,o_proj"),
                    0) == {}
    assert "not a module name" in validate({"lora_rank": 4, "lora_targets": "q-proj"},
                                           0)["lora_targets"]


def test_a_composite_configs_causal_lm_takes_its_text_part(tmp_path):
    """Llama 4's causal LM takes the text config inside the multimodal one, as transformers'
    Auto classes give it."""
    spec = models.resolve(_config_file(tmp_path, "llama4"))
    model, _ = models.build_model(spec, "meta", pretrained=False)
    assert type(model).__name__ == "Llama4ForCausalLM"
    assert type(model.config).__name__ == "Llama4TextConfig"


def test_small_configs_keep_the_configs_own_constraints():
    """bench/architectures.py's small configs: heads that divide the width, a router's top-k no
    more than its experts, a number where the defaults leave None and the model reads one."""
    from bench.architectures import architectures, small_config

    skip_unknown_model_types("bailing_hybrid", "dots1", "dots3_note_text", "esm", "hrm_text",
                             "hunyuan_v1_dense", "kimi_linear", "nllb-moe", "perceiver",
                             "speecht5", "zamba2")
    heads = dict(architectures())
    dots1 = small_config("dots1", heads["dots1"])  # 32 heads of a width scaled to 144
    assert dots1["hidden_size"] % dots1["num_attention_heads"] == 0
    assert dots1["n_routed_experts"] and dots1["n_shared_experts"]
    kimi = small_config("kimi_linear", heads["kimi_linear"])  # 8 of 256 experts, shrunk to 4
    assert kimi["num_experts_per_token"] <= kimi["num_experts"]
    bailing = small_config("bailing_hybrid", heads["bailing_hybrid"])  # 8 groups of 512 experts
    nllb = small_config("nllb-moe", heads["nllb-moe"])  # every layer runs in every step
    speecht5 = small_config("speecht5", heads["speecht5"])  # as many convolutions as it names
    assert speecht5["num_feat_extract_layers"] == len(speecht5["conv_dim"])
    assert nllb["encoder_layerdrop"] == nllb["decoder_layerdrop"] == 0
    assert bailing["num_experts"] % bailing["num_expert_group"] == 0
    assert small_config("esm", heads["esm"])["vocab_size"]  # None by default
    hunyuan = small_config("hunyuan_v1_dense", heads["hunyuan_v1_dense"])
    assert hunyuan["head_dim"] == hunyuan["hidden_size"] // hunyuan["num_attention_heads"]
    hrm = small_config("hrm_text", heads["hrm_text"])  # a stack run over in cycles
    assert hrm["num_layers_per_stack"] <= 2
    assert small_config("perceiver", heads["perceiver"])["num_self_attends_per_block"] <= 2
    # per-layer settings shrunk with the layers they belong to: the config class's own check of
    # their head sizes (sliding attention's head_dim = nope + rope) passes
    dots3 = small_config("dots3_note_text", heads["dots3_note_text"])
    assert dots3["per_layer_config"]
    models.transformers_config(models.ModelSpec("dots3", "config file", dots3))
    # what the config class derives from the width, it derives from the small width
    zamba2 = small_config("zamba2", heads["zamba2"])
    built = models.transformers_config(models.ModelSpec("zamba2", "config file", zamba2))
    assert built.mamba_headdim == built.mamba_expand * built.hidden_size // built.n_mamba_heads


@pytest.mark.parametrize("model_type", [
    "nemotron",  # key-value heads None by default, read by the model
    pytest.param("cohere_compass_text", marks=pytest.mark.skipif(
        transformers_below("5.21"), reason="transformers 5.20's own fails at a small size")),
    # no rope settings by default, read per layer type
    "reformer",  # trains only on sequences as long as its axial positions' product
    "dbrx",  # its attention reads settings its config class no longer names
    "speech-encoder-decoder",  # its encoder's own input, found by the encoder config's class
])
def test_small_configs_train_where_transformers_own_defaults_do_not(tmp_path, model_type):
    """bench/architectures.py's small configs of defaults transformers cannot build or train
    itself: a number where the defaults leave None, a model's own setting where no rule gives
    it. The config trains one step on the CPU (trains() is None), as the coverage bench's run."""
    from bench.architectures import architectures, working_config

    path, how, why = working_config(model_type, dict(architectures())[model_type], tmp_path)
    assert why is None and how == "scaled"


def test_transformers_models_index_made_from_its_first_is_the_one_it_makes_again():
    """transformers indexes its model folders on import and again for its models package;
    analysis/transformers_index.py makes the second from the first: it must be the same."""
    import inspect
    from pathlib import Path

    import transformers
    from transformers.utils import import_utils

    from anatomy.analysis.transformers_index import models_index

    cached = inspect.unwrap(import_utils.define_import_structure,
                            stop=lambda f: hasattr(f, "cache_info"))  # transformers' own
    folder = Path(transformers.__file__).parent / "models"
    made_again = cached.__wrapped__(str(folder / "__init__.py"))  # read from the files anew
    assert models_index(cached, folder) == made_again
    assert sum(len(modules) for modules in made_again.values()) > 1000  # every model's modules
    assert "llama.modeling_llama" in made_again[frozenset({"torch"})]
def test_transformers_index_read_from_the_cache_is_the_one_it_makes(tmp_path, monkeypatch):
    """The index kept in the cache folder, read back by the next process, is transformers' own
    made from its files: every backend, module and name."""
    import inspect
    from pathlib import Path

    import transformers
    from transformers.utils import import_utils

    from anatomy.analysis.transformers_index import INDEX_FILE, stored_index

    monkeypatch.setenv("ANATOMY_CACHE", str(tmp_path))
    own = inspect.unwrap(import_utils.define_import_structure,
                         stop=lambda f: hasattr(f, "cache_info")).__wrapped__  # uncached
    folder = Path(transformers.__file__).parent / "models"
    made = own(folder, prefix="models")
    calls = []

    def define(path, prefix=None):
        calls.append(path)
        return own(path, prefix)

    assert stored_index(define, folder) == made and len(calls) == 1  # made, then kept
    assert (tmp_path / INDEX_FILE).is_file()
    assert stored_index(define, folder) == made and len(calls) == 1  # read back


def test_the_kept_index_is_made_again_when_a_model_file_changes(tmp_path, monkeypatch):
    """Another transformers (a file added, edited or gone under its model folders) is another
    index; an unreadable cache file is made again."""
    from anatomy.analysis.transformers_index import INDEX_FILE, stored_index

    monkeypatch.setenv("ANATOMY_CACHE", str(tmp_path / "cache"))
    models = tmp_path / "models"
    (models / "llama").mkdir(parents=True)
    (models / "llama" / "modeling_llama.py").write_text("__all__ = ['LlamaModel']\n")
    made = []

    def define(path, prefix=None):
        made.append(sorted(p.name for p in models.rglob("*.py")))
        return {frozenset({"torch"}): {f"{prefix}.{name}": {"X"} for name in made[-1]}}

    def index():
        return stored_index(define, models)

    first = index()
    assert index() == first and len(made) == 1
    (models / "llama" / "configuration_llama.py").write_text("__all__ = ['LlamaConfig']\n")
    assert index() != first and len(made) == 2  # a file added
    (models / "llama" / "configuration_llama.py").write_text("__all__ = ['LlamaConfig2']\n")
    index()
    assert len(made) == 3  # a file edited (its size)
    (tmp_path / "cache" / INDEX_FILE).write_text("{not json")
    assert index() == made_index(made) and len(made) == 4  # unreadable: made again
    assert index() == made_index(made) and len(made) == 4


def made_index(made: list) -> dict:
    return {frozenset({"torch"}): {f"models.{name}": {"X"} for name in made[-1]}}




def _published(tmp_path, name: str, **settings) -> models.ModelSpec:
    """The tiny Llama preset with a published config's settings on top, as a user's file."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({**PRESETS["tiny-llama"].config_dict(), **settings}))
    return models.resolve(str(path))


def test_a_decoder_classifier_pads_with_the_first_of_several_end_tokens(tmp_path):
    """Llama 3.1's config names three end tokens and no padding token: its sequence classifier
    was refused ("Field 'pad_token_id' with value [2, 5, 7] doesn't match any type")."""
    spec = _published(tmp_path, "llama31-classifier", eos_token_id=[2, 5, 7], pad_token_id=None,
                      architectures=["LlamaForSequenceClassification"])
    assert models.config_class_refusal(spec.name, json.dumps(dict(spec.config))) is None
    assert models.transformers_config(spec).pad_token_id == 2


@pytest.mark.parametrize("key", ["_attn_implementation", "attn_implementation"])
def test_the_attention_a_config_was_saved_with_is_not_required_to_build_it(tmp_path, key):
    """A config saved with flash_attention_2 (Phi-3's, fine-tunes') was refused, the H200's
    prediction too, where the flash-attn package is not installed: anatomy builds it with
    transformers' own choice."""
    spec = _published(tmp_path, "flash", **{key: "flash_attention_2"})
    model, _ = models.build_model(spec, "meta", pretrained=False)
    assert model.config._attn_implementation != "flash_attention_2"


def test_checkpointing_is_the_runs_option_not_an_old_configs_key(tmp_path):
    """Configs saved by transformers 4's first versions hold "gradient_checkpointing", which
    transformers still turns on at build time: a run without --gradient-checkpointing
    checkpointed, and its H200 prediction was refused ("torch.utils.checkpoint: A different
    number of tensors was saved during the original forward and recomputation")."""
    path = tmp_path / "old-bert.json"
    path.write_text(json.dumps({**PRESETS["tiny"].config_dict(), "gradient_checkpointing": True}))
    model, _ = models.build_model(models.resolve(str(path)), "meta", pretrained=False)
    assert not any(getattr(module, "gradient_checkpointing", False) for module in model.modules())


@pytest.mark.parametrize("model, task", [
    ("tiny-llama", "CAUSAL_LM"), ("tiny", "SEQ_CLS"), ("t5", "SEQ_2_SEQ_LM"),
    ("flaubert", "SEQ_CLS"),  # its classifier is sequence_summary: none of peft's head names
    ("glm4_moe", "CAUSAL_LM"), ("deepseek_v3", "CAUSAL_LM")])  # routers no nn.Linear any more
def test_all_linear_wraps_what_peft_own_all_linear_wraps(tmp_path, model, task):
    """anatomy read "all-linear" itself, every nn.Linear but the output layer and a classifier's:
    peft's own rule also wraps a mixture of experts' routers (GLM-4 MoE, DeepSeek-V3: 1,056 and
    1,824 trainable parameters fewer) and keeps Flaubert's classifier (2,064)."""
    from peft import LoraConfig, TaskType, get_peft_model
    from peft.tuners.tuners_utils import BaseTunerLayer

    name = model if model in PRESETS else _config_file(tmp_path, model)
    assert validate(RunOptions(model=name, lora_rank=8, lora_targets="all-linear"), 0) == {}
    spec = models.resolve(name)
    plain, _ = models.build_model(spec, "meta", pretrained=False)
    ours, _ = models.build_model(spec, "meta", lora_rank=8, lora_targets=(models.ALL_LINEAR,),
                                 pretrained=False)
    peft = get_peft_model(plain, LoraConfig(r=8, target_modules="all-linear",
                                            task_type=TaskType[task]))

    def wrapped(model) -> tuple[set[str], int]:
        return ({n for n, m in model.named_modules() if isinstance(m, BaseTunerLayer)},
                sum(p.numel() for p in model.parameters() if p.requires_grad))

    assert wrapped(ours) == wrapped(peft) and wrapped(ours)[0]


@pytest.mark.parametrize("pattern, recorded", [
    (r".*\.(gate_proj|up_proj)", "gate_proj,up_proj"),
    (r"model\.layers\.0\.(self_attn\.q_proj|mlp\.up_proj)",
     "model.layers.0.mlp.up_proj,model.layers.0.self_attn.q_proj")])
def test_a_users_lora_pattern_is_recorded_as_the_modules_peft_wrapped(pattern, recorded):
    """A user's LoraConfig(target_modules=<a regular expression>) was recorded with no targets,
    and the Anatomy page predicted the architecture's own (q_proj, v_proj): gradients -42 %. The
    callback records the modules peft wrapped, which wrap the same layers in anatomy's model."""
    from peft import LoraConfig, TaskType, get_peft_model
    from peft.tuners.tuners_utils import BaseTunerLayer

    from anatomy.engine import callbacks

    spec = models.resolve("tiny-llama")
    plain, _ = models.build_model(spec, "meta", pretrained=False)
    peft = get_peft_model(plain, LoraConfig(r=4, target_modules=pattern,
                                            task_type=TaskType.CAUSAL_LM))
    said = callbacks._lora_options(peft)
    assert (said.lora_rank, said.lora_targets) == (4, recorded)
    assert validate(RunOptions(model="tiny-llama", lora_rank=4, lora_targets=recorded), 0) == {}
    ours, _ = models.build_model(spec, "meta", lora_rank=4,
                                 lora_targets=tuple(recorded.split(",")), pretrained=False)

    def wrapped(model) -> tuple[set[str], int]:
        return ({n for n, m in model.named_modules() if isinstance(m, BaseTunerLayer)},
                sum(p.numel() for p in model.parameters() if p.requires_grad))

    assert wrapped(ours) == wrapped(peft)


def test_all_linear_stands_alone_as_peft_takes_it():
    errors = validate({"model": "tiny-llama", "lora_rank": 8,
                       "lora_targets": "all-linear,lm_head"}, gpu_count=0)
    assert errors == {"lora_targets": "lora_targets: all-linear names every linear layer "
                                      "already: give it alone, as peft takes it"}


@pytest.mark.parametrize("labels, count", [
    ({"id2label": {str(i): f"emotion {i}" for i in range(28)}}, 28),  # GoEmotions' 28
    ({"num_labels": 3}, 3), ({}, models.NUM_LABELS)])
def test_a_text_classifier_has_its_configs_labels(tmp_path, labels, count):
    """A published classifier's head has its config's labels (it was always 2 for text, so the
    prediction was of another head than the user's)."""
    path = tmp_path / "classifier.json"
    path.write_text(json.dumps({**PRESETS["tiny"].config_dict(), **labels}))
    spec = models.resolve(str(path))
    model, _ = models.build_model(spec, "meta", pretrained=False)
    assert spec.num_labels == model.config.num_labels == model.classifier.out_features == count


def test_a_token_classifier_trains_its_own_head_with_its_configs_labels(token_classifier):
    """A published NER model (BertForTokenClassification, nine entity tags in its id2label) was
    refused as a head of a task anatomy did not train."""
    spec = models.resolve(token_classifier)
    assert (spec.task, spec.head, spec.num_labels) == (
        TOKEN_CLASSIFICATION, "BertForTokenClassification", 9)
    model, _ = models.build_model(spec, "meta", pretrained=False)
    assert type(model).__name__ == "BertForTokenClassification"
    assert model.config.num_labels == model.classifier.out_features == 9
    assert validate(RunOptions(model=token_classifier, seq_len=16), gpu_count=0,
                    config_class=False) == {}


@pytest.mark.parametrize("head, labels, count", [
    ("LlamaForTokenClassification", {"num_labels": 5}, 5),
    ("Qwen2ForTokenClassification", {"id2label": {str(i): f"tag {i}" for i in range(7)}}, 7),
    ("LlamaForTokenClassification", {}, models.NUM_LABELS)])
def test_a_decoder_with_a_token_head_classifies_its_tokens(tmp_path, head, labels, count):
    """A decoder's token head is its config's, not the type's causal LM (a vocabulary-wide
    output the user's model does not have)."""
    preset = "tiny-qwen2" if head.startswith("Qwen2") else "tiny-llama"
    path = tmp_path / "tagger.json"
    path.write_text(json.dumps({**PRESETS[preset].config_dict(), "architectures": [head],
                                **labels}))
    spec = models.resolve(str(path))
    assert (spec.task, spec.head, spec.num_labels) == (TOKEN_CLASSIFICATION, head, count)
    model, _ = models.build_model(spec, "meta", pretrained=False)
    assert model.score.out_features == count and model.get_output_embeddings() is None


def test_an_encoder_without_a_token_head_still_classifies_sequences():
    """The type's default is never its token head: BERT's masked-LM config classifies sequences,
    as the walkthrough's does."""
    assert models.resolve("tiny").task == SEQUENCE_CLASSIFICATION
    assert models.task_of({"model_type": "bert"}) == SEQUENCE_CLASSIFICATION
    assert models.task_of({"model_type": "bert", "architectures": ["BertForTokenClassification"]}
                          ) == TOKEN_CLASSIFICATION


def test_lora_on_a_token_classifier_trains_the_adapters_and_its_head(token_classifier):
    """peft's token-classification model: the classifier is no adapter's target (not even
    all-linear's) and trains whole beside the adapters."""
    spec = models.resolve(token_classifier)
    assert models.default_lora_targets(spec) == ("query", "value")
    # all-linear is peft's, which leaves a token classifier's head in (and then refuses to save
    # it whole): anatomy keeps it out
    every, _ = models.build_model(spec, "meta", lora_rank=4, pretrained=False,
                                  lora_targets=(models.ALL_LINEAR,))
    wrapped = {n for n, m in every.named_modules() if hasattr(m, "lora_A")}
    assert wrapped and not any("classifier" in n for n in wrapped)
    assert any(n.endswith("intermediate.dense") for n in wrapped)
    assert any("classifier.modules_to_save" in n for n, p in every.named_parameters()
               if p.requires_grad)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        lora, _ = models.build_model(spec, "meta", lora_rank=4, pretrained=False)
    assert type(lora).__name__ == "PeftModelForTokenClassification"
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert {n for n in trainable if "lora_" not in n} == {
        "base_model.model.classifier.modules_to_save.default.weight",
        "base_model.model.classifier.modules_to_save.default.bias"}


def test_a_float_json_cannot_hold_is_read_as_transformers_writes_it(tmp_path):
    """save_pretrained writes Mamba-2's time_step_limit (0, infinity) as [0.0, {"__float__":
    "Infinity"}]; the config class refused that object, and both predict and run with it."""
    from transformers import AutoConfig

    AutoConfig.for_model("mamba2", hidden_size=64, num_heads=8, head_dim=16, vocab_size=128,
                         num_hidden_layers=2).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["time_step_limit"][1] == \
        {"__float__": "Infinity"}
    spec = models.resolve(str(tmp_path))
    assert models.transformers_config(spec).time_step_limit[1] == float("inf")
    assert models.config_class_refusal(spec.name, json.dumps(spec.config)) is None


def test_a_head_that_needs_a_library_this_machine_lacks_is_refused_before_its_run(tmp_path):
    """DiNAT's head needs natten (transformers' requires_backends, in its __init__): the run
    was started, then failed; the prediction refused it. Both now refuse it in the run's line."""
    pytest.importorskip("transformers")
    if importlib.util.find_spec("natten") is not None:
        pytest.skip("natten is installed here: DiNAT builds")
    from transformers import DinatConfig

    path = tmp_path / "dinat.json"
    DinatConfig(depths=[1, 1, 1, 1]).to_json_file(path)
    spec = models.resolve(str(path))
    refusal = models.config_class_refusal(spec.name, json.dumps(dict(spec.config)))
    assert refusal is not None and refusal.startswith("model: dinat: transformers cannot build "
                                                      "it: modeling_dinat.py, ") \
        and "requires the natten library" in refusal, refusal
    from anatomy.prediction import PredictionError, predict

    with pytest.raises(PredictionError) as predicted:
        predict(RunOptions(model=str(path)), device="cpu")
    assert str(predicted.value) == refusal


def _saved_adapter(folder, config) -> dict:
    """A small Llama's adapters as peft's save_pretrained writes them, in `folder`, of a base model
    saved in the working directory's "my-llama" and loaded from there by that relative name, as a
    user's script does; the adapter_config.json written."""
    from peft import get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, vocab_size=128)).save_pretrained("my-llama")
    base = LlamaForCausalLM.from_pretrained("my-llama")
    get_peft_model(base, config).save_pretrained(folder)
    assert not (folder / "config.json").exists()
    return json.loads((folder / "adapter_config.json").read_text())


def test_a_folder_of_lora_adapters_names_its_base_model_and_the_options_that_train_it(
        tmp_path, monkeypatch):
    """A LoRA adapter's folder (peft writes no config.json there) was "has no config.json": the
    line says what it is and the options for its base model with such adapters."""
    from peft import LoraConfig

    monkeypatch.chdir(tmp_path)
    written = _saved_adapter(tmp_path / "adapter", LoraConfig(r=8, target_modules=["v_proj",
                                                                                   "q_proj"]))
    assert written["base_model_name_or_path"] == "my-llama" and written["r"] == 8
    with pytest.raises(ModelError) as refused:
        models.resolve(str(tmp_path / "adapter"))
    assert str(refused.value) == (
        f"model: {tmp_path / 'adapter'} is a PEFT adapter, not a model: name its base model with"
        " its adapters (--model my-llama --lora-rank 8 --lora-targets q_proj v_proj)")
    # What it names is a run's options here (the base model by the name the script loaded it).
    assert validate(RunOptions(model="my-llama", lora_rank=8, lora_targets=("q_proj", "v_proj")),
                    gpu_count=0) == {}


def test_a_folder_of_adapters_anatomy_does_not_train_says_what_it_trains(tmp_path, monkeypatch):
    from peft import IA3Config

    monkeypatch.chdir(tmp_path)
    _saved_adapter(tmp_path / "ia3", IA3Config(target_modules=["k_proj", "v_proj"],
                                               feedforward_modules=[]))
    with pytest.raises(ModelError, match=r"^model: .*/ia3 is a PEFT adapter, not a model \(IA3, of"
                                         r" my-llama\): anatomy trains a model's LoRA adapters "
                                         r"\(--lora-rank\) or every weight$"):
        models.resolve(str(tmp_path / "ia3"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match=r"^model: the folder .*/empty has no config.json$"):
        models.resolve(str(tmp_path / "empty"))


def test_a_model_path_with_a_control_character_is_quoted_with_its_escape(tmp_path):
    """A path's terminal escape went to the terminal as it was in "no such file or folder: …",
    colouring what followed."""
    with pytest.raises(ModelError) as refused:
        models.resolve(f"{tmp_path}/a\x1b[31mb")
    assert "\x1b" not in str(refused.value)
    assert str(refused.value).endswith("/a\\x1b[31mb")


def test_a_quantized_models_config_is_predicted_and_run_unquantized_and_says_so(tmp_path, capsys):
    """A config as transformers saves a model loaded with quantization (a BitsAndBytesConfig, a
    GPTQConfig) was predicted as the same model unquantized without a word: its
    quantization_config is left out, said where the model is described. (Not refused:
    published configs carry one where the unquantized model is what is run, gpt-oss's mxfp4.)"""
    from transformers import BitsAndBytesConfig, GPTQConfig, LlamaConfig

    from anatomy.cli import main

    for name, quantization, words in [
            ("nf4", BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4"),
             "bitsandbytes, 4-bit"),
            ("int8", BitsAndBytesConfig(load_in_8bit=True), "bitsandbytes, 8-bit"),
            ("gptq", GPTQConfig(bits=4), "gptq, 4-bit"),
            ("plain", None, None)]:
        config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, vocab_size=128)
        if quantization is not None:
            config.quantization_config = quantization
        config.save_pretrained(tmp_path / name)
        spec = models.resolve(str(tmp_path / name))
        said = models.quantization_left_out(spec.config)
        assert said == (f"its quantization_config ({words}) is left out: the weights are "
                        "unquantized" if words else None)
        assert main(["predict", "--model", str(tmp_path / name), "--device", "cpu",
                     "--batch-size", "1", "--seq-len", "8"]) == 0
        first = capsys.readouterr().out.splitlines()[0]
        assert first.endswith(f"; {said}") if said else "quantization" not in first


def test_frozen_names_read_back_what_freezing_them_freezes():
    """A model's frozen parameters named again (the largest modules wholly frozen, a parameter
    alone in a module that trains in part) freeze the same parameters in a fresh copy; a module
    shared under two names (tied embeddings) is frozen by either; a name of nothing, and
    everything frozen, are refused in one line."""
    import torch

    class Shared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.tied = self.embed  # the same module under a second name
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
            self.head = torch.nn.Linear(4, 2)

    model = Shared()
    models.freeze(model, ("tied", "blocks.0", "blocks.2.bias"))
    names = models.frozen_names(model)
    assert names == ("embed", "blocks.0", "blocks.2.bias")
    again = Shared()
    models.freeze(again, names)
    assert [p.requires_grad for p in again.parameters()] == \
        [p.requires_grad for p in model.parameters()]
    with pytest.raises(models.ModelError, match="frozen: block names no module or parameter"):
        models.freeze(Shared(), ("block",))
    with pytest.raises(models.ModelError, match="freeze every parameter of the model"):
        models.freeze(Shared(), ("embed", "blocks", "head"))

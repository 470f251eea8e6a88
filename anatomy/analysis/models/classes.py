"""transformers' classes for a model: its config object and the head class that trains (loading
transformers: only inside these functions), what that head takes first, whether it recomputes
its activations.
"""

from __future__ import annotations

import json
from functools import lru_cache

from anatomy.analysis.models.errors import ModelError, first_line
from anatomy.analysis.models.heads import HEADS_TRAINED, has_trained_head
from anatomy.analysis.models.spec import ModelSpec
from anatomy.analysis.models.tasks import (
    CAUSAL_LM,
    IMAGE_CLASSIFICATION,
    MASKED_LM,
    SEQ2SEQ,
    SEQUENCE_CLASSIFICATION,
    TOKEN_CLASSIFICATION,
    TRAINED_HEAD,
)

# The main inputs the dummy data makes for each task (analysis/dummy_data.py): token ids; pixel
# values or an image's pixel tokens; a source of token ids, a raw waveform or log-mel features.
MAIN_INPUTS = {IMAGE_CLASSIFICATION: ("pixel_values", "input_ids"),
               SEQ2SEQ: ("input_ids", "input_values", "input_features")}


def main_input(spec: ModelSpec) -> str:
    """What the model's head takes first, in transformers' own word (`main_input_name`). Where
    that is any "inputs": a composite model's (SpeechEncoderDecoderModel's) its encoder's, else
    the task's own (Perceiver's image classifier: pixel values). Loads transformers."""
    import transformers

    main = getattr(head_class(spec), "main_input_name", "input_ids")
    if main != "inputs":
        return main
    encoder = getattr(transformers_config(spec), "encoder", None)
    model = transformers.AutoModel._model_mapping.get(type(encoder), None) \
        if encoder is not None else None
    if model is not None:
        return getattr(model, "main_input_name", "input_ids")
    return "pixel_values" if spec.task == IMAGE_CLASSIFICATION else "input_ids"


def config_key(spec: ModelSpec) -> str:
    return json.dumps(spec.config, sort_keys=True, default=str)


def supports_checkpointing(spec: ModelSpec) -> bool:
    """Whether the model can recompute its activations (transformers'
    `supports_gradient_checkpointing`; ResNet, ALBERT, MPNet cannot). Loads transformers."""
    return _head_says(spec, config_key(spec), "supports_gradient_checkpointing")


def supports_sdpa(spec: ModelSpec) -> bool:
    """Whether the model's attention can be sdpa, so that eager attention is another choice
    (transformers' `_supports_sdpa`; a ResNet has no attention, Mamba none to choose). Loads
    transformers."""
    return _head_says(spec, config_key(spec), "_supports_sdpa")


@lru_cache(maxsize=64)
def _head_says(spec: ModelSpec, config_key: str, attribute: str) -> bool:
    try:
        head = head_class(spec)
    except ModelError:
        raise
    except Exception as error:  # noqa: BLE001 - a class that cannot be loaded here
        raise ModelError(f"model: transformers cannot load {spec.head or spec.model_type}: "
                         f"{first_line(error)}") from None
    return bool(getattr(head, attribute, False))


# What a config.json says of the machine or the training that saved it, not of the model: its
# dtype (the Trainer keeps fp32 weights and autocasts), its attention implementation
# (flash_attention_2 needs its package where the model is built; transformers' own choice, sdpa,
# runs the same flash algorithm on a GPU), and checkpointing, which the run's option decides
# (transformers turns an old config's "gradient_checkpointing": true on at build time).
_MACHINE_KEYS = ("model_type", "transformers_version", "torch_dtype", "dtype",
                 "attn_implementation", "_attn_implementation", "_attn_implementation_autoset",
                 "gradient_checkpointing", TRAINED_HEAD)


def transformers_config(spec: ModelSpec):
    """The transformers config object for the model's task head."""
    from transformers import AutoConfig, PretrainedConfig

    # A float JSON cannot hold (Mamba-2's time_step_limit reaches infinity) is written by
    # save_pretrained as {"__float__": "Infinity"}, and read back by from_pretrained's decoder
    values = PretrainedConfig._decode_special_floats(
        {k: v for k, v in spec.config.items() if k not in _MACHINE_KEYS})
    values["num_labels"] = spec.num_labels
    values.pop("id2label", None) if spec.task != IMAGE_CLASSIFICATION else None
    values.pop("label2id", None) if spec.task != IMAGE_CLASSIFICATION else None
    try:
        config = AutoConfig.for_model(spec.model_type, **values)
    except Exception as error:  # noqa: BLE001 - the config class's own checks, in one line
        raise ModelError(f"model: {spec.display_name}: transformers refuses the config: "
                         f"{first_line(error)}") from None
    languages = getattr(config, "languages", None)
    if getattr(config, "default_language", False) is None and languages:
        # X-MOD's adapters need the language of inputs that name none: the config's first.
        config.default_language = list(languages)[0]
    if spec.task == SEQUENCE_CLASSIFICATION and getattr(config, "pad_token_id", None) is None:
        # A decoder's classification head finds each sequence's last token by its padding id.
        # Llama 3.1 and others name several end tokens: the first.
        end = getattr(config, "eos_token_id", None)
        end = end[0] if isinstance(end, (list, tuple)) and end else end
        config.pad_token_id = end if isinstance(end, int) else 0
    return config


_AUTO_CLASSES = {SEQUENCE_CLASSIFICATION: ("AutoModelForSequenceClassification",),
                 CAUSAL_LM: ("AutoModelForCausalLM",),
                 IMAGE_CLASSIFICATION: ("AutoModelForImageClassification",),
                 SEQ2SEQ: ("AutoModelForSeq2SeqLM", "AutoModelForSpeechSeq2Seq"),
                 TOKEN_CLASSIFICATION: ("AutoModelForTokenClassification",),
                 MASKED_LM: ("AutoModelForMaskedLM",)}


def head_class(spec: ModelSpec):
    """The model class that trains: the head transformers' tables name for the config, else the
    task's Auto class's choice."""
    import transformers

    if spec.head is not None and hasattr(transformers, spec.head):
        return getattr(transformers, spec.head)
    config = transformers_config(spec)
    for name in _AUTO_CLASSES[spec.task]:
        mapping = getattr(transformers, name)._model_mapping
        if type(config) in mapping:
            return mapping[type(config)]
    if not has_trained_head(spec.model_type):  # the task was a guess: say what anatomy trains
        raise ModelError(f"model: transformers has no head of the tasks anatomy trains for "
                         f"{spec.model_type} ({type(config).__name__}): anatomy trains "
                         f"{HEADS_TRAINED}")
    raise ModelError(f"model: transformers has no {spec.task} head for "
                     f"{type(config).__name__} ({spec.display_name})")


def head_config(head, config):
    """The config `head` takes: a composite config's part of the head's own config class (Llama
    4's and Emu3's causal LMs take the text part, as transformers' Auto classes give it; MusicGen's
    its decoder's); the task's settings (labels, padding id) go with it."""
    wanted = getattr(head, "config_class", None)
    part = next((key for key, kind in getattr(config, "sub_configs", {}).items()
                 if kind is wanted and wanted is not type(config)), None)
    inner = getattr(config, part, None) if part else None
    if inner is None or type(inner) is not wanted:
        return config
    inner.num_labels = config.num_labels
    if getattr(inner, "pad_token_id", None) is None:
        inner.pad_token_id = getattr(config, "pad_token_id", None)
    return inner

"""The head a config trains with: its task and head class from transformers' own tables, read
without transformers (the index in the cache folder).
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from anatomy.analysis.models.errors import ModelError
from anatomy.analysis.models.tasks import (
    CAUSAL_LM,
    IMAGE_CLASSIFICATION,
    MASKED_LM,
    SEQ2SEQ,
    SEQUENCE_CLASSIFICATION,
    TOKEN_CLASSIFICATION,
    TRAINED_HEAD,
)

# transformers' own tables of the heads (models/auto/modeling_auto.py), per task. A model type
# without `architectures` trains the first of these its type has (an encoder with a masked-LM
# head classifies sequences, as the walkthrough's BERT does); token classification only where the
# config's `architectures` names its head (a type's token head is never its default). A
# vision-language model's head (image-text-to-text: LLaVA, Qwen2.5-VL, Mistral 3) trains as a
# causal LM on text alone: its image is optional, and its dummy data is text.
TASK_MAPPINGS: dict[str, tuple[str, ...]] = {
    IMAGE_CLASSIFICATION: ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",),
    SEQ2SEQ: ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
              "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    CAUSAL_LM: ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
                "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"),
    SEQUENCE_CLASSIFICATION: ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",),
    TOKEN_CLASSIFICATION: ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",),
}
# What a refusal names as trained.
HEADS_TRAINED = ("causal-LM (a vision-language model's on text), sequence-classification, "
                  "token-classification, image-classification and sequence-to-sequence heads")
_ENCODER_MAPPING = "MODEL_FOR_MASKED_LM_MAPPING_NAMES"
# Heads that are no task of their own: the type's task trains instead.
_BODY_MAPPINGS = ("MODEL_MAPPING_NAMES", "MODEL_FOR_PRETRAINING_MAPPING_NAMES", _ENCODER_MAPPING)

# Architectures' class-name endings, for a class transformers' tables do not list.
_HEADS_BY_SUFFIX = (
    ("ForImageClassification", IMAGE_CLASSIFICATION),
    ("ForCausalLM", CAUSAL_LM),
    ("LMHeadModel", CAUSAL_LM),
    ("ForConditionalGeneration", SEQ2SEQ),
    ("ForSequenceClassification", SEQUENCE_CLASSIFICATION),
    ("ForTokenClassification", TOKEN_CLASSIFICATION),
    ("ForMaskedLM", SEQUENCE_CLASSIFICATION),
    ("ForPreTraining", SEQUENCE_CLASSIFICATION),
    ("Model", SEQUENCE_CLASSIFICATION),
)
# Tables of heads whose names end as a trained task's do (Wav2Vec2ForSequenceClassification) but
# whose input is another: refused by their table, not trained by their name.
_OTHER_INPUTS = ("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",)
# Sub-configs that make a model of several towers (CLIP's text and vision encoders).
_TOWERS = ("text_config", "vision_config", "audio_config", "speech_config")


@lru_cache(maxsize=1)
def auto_mappings() -> dict[str, dict[str, str]]:
    """transformers' tables of model types to head classes (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and
    its kin), read as plain data from models/auto/modeling_auto.py without importing transformers
    (which loads torch: seconds); a tuple of classes keeps its first. Empty when this version
    keeps them elsewhere: the class names' endings then judge."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / "auto" / "modeling_auto.py"
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return {}
    found: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id.endswith("NAMES")
                and isinstance(node.value, ast.Call) and node.value.args):
            continue
        try:
            pairs = ast.literal_eval(node.value.args[0])
        except ValueError:
            continue
        found[node.targets[0].id] = {t: c[0] if isinstance(c, tuple) else c for t, c in pairs}
    return found


def _task_of_class(name: str) -> str | None:
    tables = auto_mappings()
    for task, mappings in TASK_MAPPINGS.items():
        if any(name in tables.get(m, {}).values() for m in mappings):
            return task
    return None


def head_of_type(model_type: str) -> str | None:
    """The head class a model type trains with when its config names none: transformers' first
    table (TASK_MAPPINGS' order) that has the type; an encoder with a masked-LM head classifies
    sequences (the walkthrough's BERT) rather than generate."""
    tables = auto_mappings()
    encoder = model_type in tables.get(_ENCODER_MAPPING, {})
    order = [IMAGE_CLASSIFICATION, SEQ2SEQ] + (
        [SEQUENCE_CLASSIFICATION, CAUSAL_LM] if encoder else [CAUSAL_LM, SEQUENCE_CLASSIFICATION])
    for task in order:
        for mapping in TASK_MAPPINGS[task]:
            head = tables.get(mapping, {}).get(model_type)
            if head is not None:
                return head
    return None


def is_masked_lm(class_name: str) -> bool:
    """Whether a model class is a masked-LM head (BertForMaskedLM), which a user's Trainer
    trains on its masked tokens (`TRAINED_HEAD`)."""
    return _task_of_class(class_name) is None and \
        class_name in auto_mappings().get(_ENCODER_MAPPING, {}).values()


def is_body(class_name: str) -> bool:
    """Whether a model class is a body rather than a task's head (the bare model, a masked-LM
    or pre-training head): a config that names one trains its model type's task instead (the
    walkthrough's BERT classifies sequences)."""
    tables = auto_mappings()
    return _task_of_class(class_name) is None and \
        any(class_name in tables.get(m, {}).values() for m in _BODY_MAPPINGS)


def has_trained_head(model_type: str) -> bool:
    """Whether transformers' tables list a head of a task anatomy trains for the model type
    (True where this version keeps its tables elsewhere: the build then judges)."""
    tables = auto_mappings()
    return not tables or any(model_type in tables.get(mapping, {})
                             for mappings in TASK_MAPPINGS.values() for mapping in mappings)


def head_task(head: str) -> str | None:
    """The task a head class trains (by transformers' tables), before the config decides
    whether a sequence-to-sequence head is an encoder-decoder."""
    return _task_of_class(head)


def _encoder_decoder(config: Mapping[str, Any]) -> bool:
    """An encoder-decoder (T5, BART, Whisper) rather than a decoder behind other towers (an audio
    LM in transformers' sequence-to-sequence table: its text trains as a causal LM)."""
    value = config.get("is_encoder_decoder")
    return value if isinstance(value, bool) else not any(k in config for k in _TOWERS)


def task_and_head(config: Mapping[str, Any]) -> tuple[str, str | None]:
    """The task a config trains and its head class (None: the task's Auto class picks). The
    architecture's class decides where transformers' tables list it as one of the tasks' heads;
    a body (the bare model, a masked-LM or pre-training head) trains its model type's task;
    ModelError for a bare model of two towers (CLIP), which has no task head."""
    model_type = config.get("model_type")
    trained = config.get(TRAINED_HEAD)
    if isinstance(trained, str) and is_masked_lm(trained):  # what a user's Trainer trained
        return MASKED_LM, trained
    architecture = next((a for a in config.get("architectures") or () if isinstance(a, str)),
                        None)
    if architecture is not None:
        task = _task_of_class(architecture)
        if task is None and not any(architecture in auto_mappings().get(m, {}).values()
                                    for m in _BODY_MAPPINGS):
            if any(architecture in auto_mappings().get(m, {}).values() for m in _OTHER_INPUTS):
                _refuse_other_head(architecture, model_type)
            # a class these tables do not list (another version's): its name's ending
            task = next((t for suffix, t in _HEADS_BY_SUFFIX if architecture.endswith(suffix)),
                        None)
            if task is None:
                _refuse_other_head(architecture, model_type)
            architecture = None
        if task is not None and (task != SEQUENCE_CLASSIFICATION or architecture is not None
                                 or head_of_type(model_type) is None):
            return _decoder_only(task, config), architecture
        towers = [k for k in _TOWERS if isinstance(config.get(k), dict)]
        if len(towers) > 1 and architecture in auto_mappings().get("MODEL_MAPPING_NAMES",
                                                                    {}).values():
            raise ModelError(
                f"model: {architecture} is a model of {len(towers)} towers ({', '.join(towers)}) "
                f"trained by contrasting them, with no task head: anatomy trains {HEADS_TRAINED}")
    head = head_of_type(model_type) if isinstance(model_type, str) else None
    if head is not None:
        return _decoder_only(_task_of_class(head), config), head
    if "image_size" in config and "vocab_size" not in config:
        return IMAGE_CLASSIFICATION, None
    if config.get("is_decoder"):
        return CAUSAL_LM, None
    return SEQUENCE_CLASSIFICATION, None


def _refuse_other_head(architecture: str, model_type: object) -> None:
    """ModelError for a head of a task anatomy does not train (question answering, multiple
    choice…), where transformers' tables list it: the type's own head would be trained in its
    place — for a decoder, a vocabulary-wide output the user's model does not have."""
    tables = auto_mappings()
    table = next((m for m, heads in tables.items()
                  if m.startswith("MODEL_FOR_") and architecture in heads.values()), None)
    if table is None:
        return  # a class of another version's: the type's task trains
    what = table.removeprefix("MODEL_FOR_").removesuffix("_MAPPING_NAMES").lower()
    what = what.replace("_", " ")
    instead = tables.get("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", {}).get(model_type)
    raise ModelError(
        f"model: {architecture} is {'an' if what[0] in 'aeiou' else 'a'} {what} head: anatomy "
        f"trains {HEADS_TRAINED}"
        + (f" (architectures: [\"{instead}\"] predicts the same body with one)" if instead
           else ""))


def _decoder_only(task: str, config: Mapping[str, Any]) -> str:
    return CAUSAL_LM if task == SEQ2SEQ and not _encoder_decoder(config) else task


def task_of(config: Mapping[str, Any]) -> str:
    """The head a config trains with (`task_and_head`)."""
    return task_and_head(config)[0]


@lru_cache(maxsize=1)
def known_model_types() -> frozenset[str] | None:
    """The model types the installed transformers can build, read from its generated table
    (transformers/models/auto/auto_mappings.py, plain data) without importing transformers,
    which would load torch: seconds for a check that the form makes on every click. None when
    the table is not where this version keeps it: the build then judges."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / "auto" / "auto_mappings.py"
    if not path.is_file():
        return None
    loader = importlib.util.spec_from_file_location("_anatomy_auto_mappings", path)
    module = importlib.util.module_from_spec(loader)
    try:
        loader.loader.exec_module(module)
        return frozenset(module.CONFIG_MAPPING_NAMES)
    except Exception:  # noqa: BLE001 - a changed file only loses the early check
        return None

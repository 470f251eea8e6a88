"""A model as a run names it, resolved (`ModelSpec`: its config and where it came from), the shipped
presets, and the names lists and titles give a model.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anatomy.analysis.models.heads import task_and_head
from anatomy.analysis.models.tasks import (
    CLASSIFICATIONS,
    IMAGE_CLASSIFICATION,
    IMAGE_SIZE,
    NUM_LABELS,
    SEQ2SEQ,
)
from anatomy.vocabulary import ModelSource

CONFIG_DIR = Path(__file__).parents[1] / "configs"

# Where a config keeps its longest sequence (GPT-2 names it n_positions, Whisper's decoder
# max_target_positions).
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length",
                 "max_target_positions")


@dataclass(frozen=True)
class Preset:
    name: str
    hub_id: str | None  # where pretrained weights would come from, if cached locally
    description: str

    @property
    def config_path(self) -> Path:
        return CONFIG_DIR / f"{self.name}.json"

    def config_dict(self) -> dict:
        return json.loads(self.config_path.read_text())


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("bert-large-uncased", "google-bert/bert-large-uncased",
               "BERT large, 24 layers, hidden 1024: the walkthrough's model (default on a GPU)"),
        Preset("bert-base-uncased", "google-bert/bert-base-uncased",
               "BERT base, 12 layers, hidden 768"),
        Preset("gpt2", "openai-community/gpt2", "GPT-2, 124 M parameters: a decoder LM"),
        Preset("tinyllama-1.1b", "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
               "TinyLlama 1.1 B: the Llama architecture, 22 layers, hidden 2048, grouped-query"
               " attention"),
        Preset("qwen2-0.5b", "Qwen/Qwen2-0.5B",
               "Qwen2 0.5 B: 24 layers, hidden 896, a 151,936-token vocabulary"),
        Preset("vit-base-patch16-224", "google/vit-base-patch16-224",
               "ViT-base/16: an image classifier on 224×224 images, 1000 classes"),
        Preset("tiny", None, "tiny BERT, 2 layers, hidden 128: for CPU demos (default without a GPU)"),
        Preset("tiny-gpt2", None, "tiny GPT-2, 2 layers, hidden 64: for CPU tests"),
        Preset("tiny-llama", None, "tiny Llama, 2 layers, hidden 64, grouped-query attention"),
        Preset("tiny-qwen2", None, "tiny Qwen2, 2 layers, hidden 64, tied embeddings"),
        Preset("tiny-vit", None, "tiny ViT, 2 layers, hidden 64, 32×32 images"),
    )
}

GPU_DEFAULT = "bert-large-uncased"
CPU_DEFAULT = "tiny"


def default_preset(has_gpu: bool) -> str:
    return GPU_DEFAULT if has_gpu else CPU_DEFAULT


@dataclass(frozen=True)
class ModelSpec:
    """A model as a run names it, resolved: its config and where it came from."""

    name: str  # as the run option holds it: a preset, a path or a Hub id
    source: ModelSource
    config: Mapping[str, Any] = field(compare=False)
    config_path: Path | None = None
    hub_id: str | None = None  # pretrained weights may be in the local cache under this id

    @property
    def display_name(self) -> str:
        return display_name(self.name)

    @property
    def model_type(self) -> str:
        return self.config["model_type"]

    @property
    def task(self) -> str:
        return task_and_head(self.config)[0]

    @property
    def head(self) -> str | None:
        """The head's class in transformers (None: the task's Auto class picks it)."""
        return task_and_head(self.config)[1]

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the config allows (None: no limit in the config, or images)."""
        if self.task == IMAGE_CLASSIFICATION:
            return None
        return next((self.config[k] for k in POSITION_KEYS if isinstance(self.config.get(k), int)),
                    None)

    @property
    def vocab_size(self) -> int | None:
        """The tokens the inputs may hold: the config's, or its text tower's (a multimodal
        model's), else the smallest of its own vocabularies (FSMT's source and target)."""
        for config in (self.config, self.config.get("text_config"), self.config.get("decoder")):
            if isinstance(config, Mapping) and isinstance(config.get("vocab_size"), int):
                return config["vocab_size"]
        own = [v for k, v in self.config.items() if k.endswith("_vocab_size")
               and k != "type_vocab_size" and isinstance(v, int) and not isinstance(v, bool)]
        return min(own, default=None)

    @property
    def image_size(self) -> int | None:
        """The images' side: the config's, else its vision tower's (CLIP's and SigLIP's classifiers:
        clip-vit-large-patch14-336 names 336 there alone), or 224 where none is named (ResNet,
        RegNet)."""
        if self.task != IMAGE_CLASSIFICATION:
            return None
        size = self._vision_setting("image_size")
        if isinstance(size, list) and size and isinstance(size[0], int):
            size = size[0]
        return size if isinstance(size, int) and not isinstance(size, bool) else IMAGE_SIZE

    def _vision_setting(self, key: str):
        """The config's `key`, else its vision tower's (`vision_config`); None where neither names
        it."""
        vision = self.config.get("vision_config")
        if key not in self.config and isinstance(vision, Mapping):
            return vision.get(key)
        return self.config.get(key)

    def audio_features(self, seq_len: int) -> tuple[int, int] | None:
        """A speech encoder's log-mel input, one sample's shape: Whisper's (mel bins, frames: two
        per encoder position, which it requires), or `seq_len` frames of the features
        Speech2Text's config or a Parakeet encoder's (Canary's, Cohere ASR's) names; None for a
        config that names none."""
        if self.task != SEQ2SEQ:
            return None
        config = self.config
        bins, positions = config.get("num_mel_bins"), config.get("max_source_positions")
        if isinstance(bins, int) and isinstance(positions, int):
            return bins, 2 * positions
        per_channel = config.get("input_feat_per_channel")
        if isinstance(per_channel, int):
            return seq_len, per_channel * (config.get("input_channels") or 1)
        encoder = config.get("encoder_config") or config.get("encoder") or {}
        bins = encoder.get("num_mel_bins", bins) if isinstance(encoder, dict) else bins
        return (seq_len, bins) if isinstance(bins, int) else None

    @property
    def decoder_start_token_id(self) -> int:
        """The token a decoder's inputs begin with (the labels shifted right behind it), as the
        model's own `shift_tokens_right` takes it."""
        for config in (self.config, self.config.get("decoder") or {}):
            for key in ("decoder_start_token_id", "bos_token_id", "pad_token_id"):
                if isinstance(config.get(key), int):
                    return config[key]
        return 0

    @property
    def num_channels(self) -> int:
        channels = self._vision_setting("num_channels")
        return channels if isinstance(channels, int) and not isinstance(channels, bool) else 3

    @property
    def num_labels(self) -> int:
        """Labels of the classification head: the config's (num_labels, else its id2label's),
        else 2 (the walkthrough's binary labels); a causal LM's labels are its input ids.
        `check_config` refuses a classifier's num_labels below 1."""
        if self.task in CLASSIFICATIONS:
            count = self.config.get("num_labels")
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                return count
            labels = self.config.get("id2label")
            return len(labels) if isinstance(labels, dict) and labels else NUM_LABELS
        return NUM_LABELS


def display_name(model: str) -> str:
    """What lists and titles call a model: a preset's or a Hub id's name, a path's folder (or its
    file name without .json when the file is not called config.json)."""
    if model in PRESETS or not looks_like_path(model):
        return model
    path = Path(model)
    cached = next((part for part in path.parts if HUB_FOLDER.fullmatch(part)), None)
    if cached is not None:  # a folder of the local Hub cache: its model's id
        return "/".join(HUB_FOLDER.fullmatch(cached).groups())
    if path.name == "config.json":
        return path.parent.name or model
    # A folder's name keeps its dots (Meta-Llama-3.1-8B, Qwen2.5-7B); a file loses its .json.
    return (path.stem if path.suffix.lower() == ".json" else path.name) or model


# A model's folder in the local Hugging Face cache (huggingface_hub's layout): its config in
# snapshots/<revision>/, the revision of "main" in refs/main.
HUB_FOLDER = re.compile(r"models--([^/]+?)--([^/]+)")


def looks_like_path(text: str) -> bool:
    return (os.sep in text and not is_hub_id(text)) or text.endswith(".json") or \
        text.startswith((".", "~")) or path_exists(Path(text))


def is_hub_id(text: str) -> bool:
    """"org/name", the shape of a Hub id (a relative path of two parts has it too: a path that
    exists wins)."""
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.startswith((".", "/", "~")) and \
        not path_exists(Path(text))


def path_exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


def token_range(spec: ModelSpec, vocab: int | None = None) -> tuple[int, int]:
    """The dummy data's token ids: the walkthrough's [100, 30000), within the vocabulary (`vocab`
    where a part of the model has its own; a tiny one's start at 0), below the first token that
    stands for an image, a video or audio (a vision-language model's image token in the text makes
    it look for an image the text does not bring)."""
    high = min(30000, vocab or spec.vocab_size or 30000)
    low = 100 if high > 200 else 0
    media = [v for k, v in spec.config.items() if "token" in k and isinstance(v, int)
             and not isinstance(v, bool) and any(m in k for m in _MEDIA) and low < v < high]
    return low, min(media, default=high)


_MEDIA = ("image", "video", "audio", "vision", "boi", "eoi", "boa", "eoa")  # tokens' key words

"""Model presets: BERT configs shipped in the repo, built with random weights when offline.

Random weights take exactly the memory pretrained ones do, so every preset works without the Hub;
pretrained weights are used when they are already in the local Hugging Face cache.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

CONFIG_DIR = Path(__file__).parent / "configs"


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
        Preset("tiny", None, "tiny BERT, 2 layers, hidden 128: for CPU demos (default without a GPU)"),
    )
}

GPU_DEFAULT = "bert-large-uncased"
CPU_DEFAULT = "tiny"


def default_preset(has_gpu: bool) -> str:
    return GPU_DEFAULT if has_gpu else CPU_DEFAULT


def parameter_count(config: dict, num_labels: int = 2) -> int:
    """Parameters of BertForSequenceClassification for a BERT config, counted from its shape.

    Matches `sum(p.numel() for p in model.parameters())` exactly (checked in the tests), so a
    prediction can be made before the model exists.
    """
    h = config["hidden_size"]
    layers = config["num_hidden_layers"]
    inter = config["intermediate_size"]
    embeddings = (config["vocab_size"] + config["max_position_embeddings"]
                  + config["type_vocab_size"]) * h + 2 * h  # + LayerNorm
    per_layer = (
        4 * (h * h + h)          # query, key, value, attention output
        + 2 * h                  # attention LayerNorm
        + h * inter + inter      # intermediate
        + inter * h + h          # output
        + 2 * h                  # output LayerNorm
    )
    pooler = h * h + h
    classifier = h * num_labels + num_labels
    return embeddings + layers * per_layer + pooler + classifier


def build_model(name: str, num_labels: int = 2):
    """The preset's model for sequence classification, and where its weights came from.

    Imports transformers lazily: callers in the worker decide when that cost (and memory) lands.
    """
    from transformers import AutoModelForSequenceClassification, BertConfig

    preset = PRESETS[name]
    if preset.hub_id is not None:
        try:
            model = AutoModelForSequenceClassification.from_pretrained(
                preset.hub_id, num_labels=num_labels, local_files_only=True)
            return model, "pretrained (local cache)"
        except (OSError, ValueError):
            pass  # not cached: random weights take the same memory
    config = BertConfig.from_dict({**preset.config_dict(), "num_labels": num_labels})
    return AutoModelForSequenceClassification.from_config(config), "random (from config)"

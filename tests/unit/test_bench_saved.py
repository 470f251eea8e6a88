"""bench/architectures.py's saved configs at a real depth (`--saved`): the model each config makes
is the architecture at that depth, of a size the bench's machine trains."""

from __future__ import annotations


def test_a_staged_vision_model_keeps_its_stages_at_a_real_depth():
    """Swin's num_layers is its stages (its depths' length): raised to 12, each stage halving the
    image and doubling the width, it made a model of 196,608 channels, killed for memory."""
    from bench.architectures import DEEP, architectures, small_config

    heads = dict(architectures())
    for model_type in ("swin", "swinv2", "donut-swin"):
        config = small_config(model_type, heads[model_type], depth=DEEP)
        assert config["num_layers"] == len(config["depths"]) == len(config["num_heads"]) == 4
        assert config["depths"] == [1, 1, 1, 1]
    assert small_config("vit", heads["vit"], depth=DEEP)["num_hidden_layers"] == DEEP


def test_a_saved_config_too_large_with_scaled_widths_takes_the_fixed_ones(tmp_path):
    """Granite Speech's scaled widths keep its 4,096-wide text model: at 12 layers 2.9 B
    parameters, more than the bench's machine trains; its fixed widths make a small model."""
    from transformers import AutoConfig

    from bench.architectures import DEEP, LARGEST, architectures, parameters, small_config

    head = dict(architectures())["granite_speech"]
    sizes = {}
    for scaled in (True, False):
        values = small_config("granite_speech", head, scaled, DEEP)
        values.pop("model_type")
        folder = tmp_path / str(scaled)
        AutoConfig.for_model("granite_speech", **values).save_pretrained(folder)
        sizes[scaled] = parameters(folder)
    assert sizes[True] > LARGEST > sizes[False] > 0

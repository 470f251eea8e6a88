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


def test_fixed_widths_fix_the_width_a_stack_names_of_another():
    """BLT's local encoder and decoder name the global transformer's width (hidden_size_global):
    fixed with the global transformer's own, or the stacks meet in a matrix of the old width."""
    from bench.architectures import DEEP, architectures, small_config

    config = small_config("blt", dict(architectures())["blt"], False, DEEP)
    width = config["global_config"]["hidden_size"]
    assert config["encoder_config"]["hidden_size_global"] == width
    assert config["decoder_config"]["hidden_size_global"] == width


def test_a_second_name_of_the_layers_follows_the_depth():
    """xLSTM builds num_blocks blocks, 32 by default beside num_hidden_layers: a config of 12
    layers is 12 blocks deep."""
    from transformers import AutoConfig

    from bench.architectures import DEEP, architectures, small_config

    values = small_config("xlstm", dict(architectures())["xlstm"], depth=DEEP)
    values.pop("model_type")
    assert AutoConfig.for_model("xlstm", **values).num_blocks == DEEP

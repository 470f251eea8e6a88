"""Coverage: every architecture the installed transformers ships with a head anatomy trains, a small
config of each made from the architecture's own defaults, predicted and run.

    python bench/architectures.py                      # everything -> docs/COVERAGE.md
    python bench/architectures.py --only llama,t5      # some model types
    python bench/architectures.py --report             # the table again from stored results
    python bench/architectures.py --configs DIR        # only write the small configs
    python bench/architectures.py --token-heads        # each type's token head -> COVERAGE-TOKENS.md
    python bench/architectures.py --saved              # each config at 12 layers, saved -> a column
    python bench/architectures.py --saved --part 2/4   # the second quarter of them

The architectures come from transformers' own auto mappings (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
…SEQUENCE_CLASSIFICATION…, …IMAGE_CLASSIFICATION…, …SEQ_TO_SEQ_CAUSAL_LM…, …SPEECH_SEQ_2_SEQ…):
no list of ours. Each model type trains the head `models.task_of` picks for a config without
`architectures` (the same rule a user's config meets); a token-classification head is no type's
default (a config's `architectures` names it), so `--token-heads` enumerates them apart: every
type of transformers' token-classification table, its head named in `architectures` as an NER
model's config names it. Its config is the
config class's defaults, shrunk (`small_config`): two layers, hidden size 64, a 1,024-token
vocabulary, four experts; vision models keep their stages (one block each) and their image size.

For each: `predict` on the CPU (fp32), for the H200 (bf16; fp32 with checkpointing; LoRA), then
a real two-step CPU run through the worker's own training code and probe (the same process, one
model after another), and the CPU prediction next to what the probe measured: weights,
gradients, optimizer states and activations, to the byte. Each model runs in a child process
with a time limit, so a crash or a hang is one row, not the end of the table. Results go to
DIR/coverage.jsonl as they come (a second call skips what is there) and docs/COVERAGE.md.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Sizes a small config shrinks to (never grows to): enough for every part of a layer to be there.
LAYERS = 2
DEEP = 12  # the layers of the saved configs' column: a real depth, as save_pretrained writes it
HIDDEN = 64
INTERMEDIATE = 128
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
VOCAB = 1024
POSITIONS = 2048
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
EXPERT_INTERMEDIATE = 32
IMAGE_SIZE = 224  # the size most image classifiers train on; larger defaults come down to it

SCALED_FROM = 32  # smaller "sizes" are groups, kernels, counts: left alone
_LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
               "decoder_layers", "num_decoder_layers", "num_encoder_layers")
_WIDTH_KEYS = ("hidden_size", "d_model", "n_embd", "dim", "word_embed_proj_dim")
_FFN_KEYS = ("intermediate_size", "d_ff", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim",
             "n_inner", "hidden_dim", "ffn_hidden_size")
_EXPERT_FFN_KEYS = ("moe_intermediate_size", "shared_expert_intermediate_size",
                    "expert_intermediate_size")
_HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
              "decoder_attention_heads")
_KV_HEAD_KEYS = ("num_key_value_heads", "n_head_kv", "num_kv_heads")
_HEAD_DIM_KEYS = ("head_dim", "d_kv", "attention_head_dim", "v_head_dim")
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k", "top_k",
               "num_selected_experts")
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_target_positions")
_TOKEN_ID_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
                  "sep_token_id", "cls_token_id", "mask_token_id", "unk_token_id")


def head_mappings() -> dict[str, dict[str, str]]:
    """Task -> {model type: head class}, from transformers' auto mappings (a tuple of classes
    keeps its first)."""
    from transformers.models.auto import modeling_auto as auto

    from anatomy.analysis import models

    out: dict[str, dict[str, str]] = {}
    for task, names in models.TASK_MAPPINGS.items():
        table: dict[str, str] = {}
        for name in names:
            for model_type, classes in getattr(auto, name).items():
                table.setdefault(model_type, classes[0] if isinstance(classes, tuple) else classes)
        out[task] = table
    return out


def architectures(token_heads: bool = False) -> list[tuple[str, str]]:
    """(model type, head class) of every model type with a supported head, the head the
    project's own rule picks for the type; `token_heads`: every type's token-classification head
    instead (no type's default: a config's `architectures` names it)."""
    from anatomy.analysis import models

    found = []
    known = models.known_model_types() or frozenset()
    if token_heads:
        tokens = head_mappings()[models.TOKEN_CLASSIFICATION]
        return [(model_type, tokens[model_type]) for model_type in sorted(set(tokens) & known)]
    for model_type in sorted(set().union(*head_mappings().values()) & known):  # not aliases
        head = models.head_of_type(model_type)
        if head is not None:
            found.append((model_type, head))
    return found


def _shrink_int(values: dict, keys, target: int) -> None:
    for key in keys:
        value = values.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > target:
            values[key] = target


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Widths: what scales with the model's width (a size, a dimension, a rank); not lengths (of the
# vocabulary, an image, a patch, a window, a kernel, a chunk, a position table).
_LENGTHS = ("vocab", "image", "patch", "kernel", "window", "chunk", "block", "pool_size", "stride",
            "position", "bucket", "max_", "conv", "seq", "length", "spatial", "temporal")


def _is_width(key) -> bool:
    if not isinstance(key, str):
        return False
    named = key.endswith(("_size", "_dim", "_dims", "_embd", "_inner", "_rank", "_channels",
                          "_groups", "d_head", "d_state")) or \
        key in ("d_model", "d_ff", "d_kv", "dim", "n_embd", "embed_dim", "hidden_dim")
    return named and not any(word in key for word in _LENGTHS) and not key.startswith("num_")


def _widths(values: dict) -> list[int]:
    own = [v for k, v in values.items() if _is_width(k) and _is_int(v) and v > 0]
    return own + [w for v in values.values() if isinstance(v, dict) for w in _widths(v)]


def scale_factor(values: dict) -> int:
    """The power of two every width of a config (its sub-configs' too) is divided by: as large
    as leaves the widest at 256 or more and every width even (a rotary embedding halves its
    head size), so that sizes made from others (heads × head size, hidden // 4) stay so."""
    widths = [w for w in _widths(values) if w >= SCALED_FROM]
    factor = 1
    while widths and max(widths) // (factor * 2) >= 256 and \
            all(w % (factor * 4) == 0 for w in widths):
        factor *= 2
    return factor


def _shrink_counts(values: dict, layers_before, depth: int = LAYERS) -> None:
    """Layers (to `depth`), experts, the vocabulary and the position table, whatever the widths
    do."""
    if _is_int(layers_before) and values.get("num_blocks") == layers_before:
        # xLSTM's blocks, another name of its layers (the model builds num_blocks, its class
        # fills them from num_hidden_layers where None): left at 32 beside 12 layers, the model
        # was 32 blocks deep, and too slow to train on the bench's machine
        values["num_blocks"] = None
    _shrink_int(values, _LAYER_KEYS, depth)
    # Layers repeated within a stack or a block (HRM's stacks run in cycles, Perceiver's
    # self-attention layers in each block): as deep as the stacks
    _shrink_int(values, [k for k in values if re.fullmatch(r"num_\w+_per_(stack|block)",
                                                           str(k))], depth)
    _shrink_int(values, _EXPERT_KEYS, EXPERTS)
    _shrink_int(values, [k for k in values if re.fullmatch(r"\w*expert_num", str(k))], EXPERTS)
    experts = next((values[k] for k in _EXPERT_KEYS if _is_int(values.get(k))), None)
    for key in _TOP_K_KEYS:  # a router needs its top-k (some defaults leave it None)
        if key in values and values[key] is None and experts:
            values[key] = EXPERTS_PER_TOKEN
    _shrink_int(values, _TOP_K_KEYS, EXPERTS_PER_TOKEN)
    _shrink_int(values, ("n_group", "num_expert_group", "topk_group"), 1)  # experts in groups
    _shrink_int(values, ("first_k_dense_replace",), 1)
    _shrink_int(values, _POSITION_KEYS, POSITIONS)
    _shrink_int(values, [k for k in values if "vocab_size" in str(k) or str(k).endswith("_vocab")],
                VOCAB)
    for key, value in list(values.items()):  # special tokens inside the small vocabulary
        if (key in _TOKEN_ID_KEYS or key.endswith(("_token_id", "_token_index"))) \
                and _is_int(value) and value >= VOCAB:
            values[key] = VOCAB - 1 - (sum(map(ord, key)) % 64)
        elif key in _TOKEN_ID_KEYS and isinstance(value, list):
            values[key] = [v if v < VOCAB else VOCAB - 1 for v in value if _is_int(v)]
    layers = next((values[k] for k in _LAYER_KEYS if _is_int(values.get(k))), None)
    if depth > LAYERS and _is_int(layers_before) and _is_int(layers) and layers < depth:
        _deepen(values, layers_before, depth)
        return
    if not (_is_int(layers_before) and _is_int(layers) and layers < layers_before):
        return
    for key in ("out_features", "out_indices", "stage_names"):  # a backbone's: follow depth
        values.pop(key, None)
    kept = list(range(layers))  # the layers kept, by their index in the defaults
    types = values.get("layer_types")
    if isinstance(types, list) and len(types) == layers_before:
        distinct = list(dict.fromkeys(map(str, types)))  # every kind of layer, once
        chosen = [next(i for i, t in enumerate(types) if str(t) == kind) for kind in distinct]
        kept = (chosen + list(range(layers_before)))[:max(layers, len(chosen))]
        if depth > LAYERS and set(map(str, types[:layers])) == set(distinct):
            kept = list(range(layers))  # at a real depth, the class's own pattern
        values["layer_types"] = [types[i] for i in kept]
        for key in _LAYER_KEYS:
            if values.get(key) == layers:
                values[key] = len(values["layer_types"])
        layers = len(values["layer_types"])
    lengths = {len(v) for v in values.values() if isinstance(v, list)} - {layers_before}
    for key, value in list(values.items()):  # how many of the layers do something: in proportion
        if re.fullmatch(r"num_\w+_layers", key) and key not in _LAYER_KEYS and _is_int(value) \
                and value > layers and value not in lengths:  # not a list's length (SpeechT5's
            values[key] = value * layers // layers_before  # feature-encoder layers: conv_dim's)
    for key, value in list(values.items()):
        if key != "layer_types" and isinstance(value, list) and len(value) == layers_before:
            values[key] = [value[i] for i in kept]
        elif key.endswith("_layers") and isinstance(value, list) and all(map(_is_int, value)):
            values[key] = [v for v in value if v < layers]
        elif isinstance(value, dict) and value and all(str(k).isdigit() for k in value):
            by_index = {int(k): v for k, v in value.items()}  # per layer: the kept layers'
            values[key] = {type(next(iter(value)))(new): by_index[old]
                           for new, old in enumerate(kept) if old in by_index}


def _deepen(values: dict, layers_before: int, depth: int) -> None:
    """Layer counts below `depth` (defaults of fewer layers) raised to it; a list with an entry
    per layer repeated to that depth (Reformer's local and LSH layers in turn), the other fields
    tied to the layers left out, for the config class to make at that depth."""
    from anatomy.prediction.blocks import per_layer_fields

    for key, kind in per_layer_fields(values, layers_before).items():
        if kind == "entries":
            values[key] = (values[key] * depth)[:depth]
        else:
            values.pop(key)
    for key in _LAYER_KEYS:
        if _is_int(values.get(key)) and values[key] < depth:
            values[key] = depth


def _shrink(values: dict, vision: bool, factor: int | None, depth: int = LAYERS) -> dict:
    """One config's dict, shrunk in place (sub-configs too). `factor`: every width divided by it
    (sizes made from others stay so); None: widths set to small fixed sizes. `vision` keeps
    widths and image sizes (stages depend on them) and cuts each stage to one block. `depth`:
    the layers of each stack."""
    for key, value in list(values.items()):
        if isinstance(value, dict) and key not in ("id2label", "label2id", "rope_parameters",
                                                   "rope_scaling") \
                and not all(str(k).isdigit() for k in value):
            values[key] = _shrink(value, vision or key.startswith(("vision", "image")), factor,
                                  depth)
        elif isinstance(value, dict) and value and all(str(k).isdigit() for k in value):
            for layer, settings in value.items():  # a layer's own settings: shrunk alike
                if isinstance(settings, dict):
                    value[layer] = _shrink(settings, vision, factor, depth)
    layers_before = next((values[k] for k in _LAYER_KEYS if _is_int(values.get(k))), None)
    for key, value in values.items():
        # LayerDrop skips layers at random while training: the probe's step then holds what
        # fewer layers save (NLLB-MoE's second step, one layer short, 6.5 of 12.3 MB), the
        # prediction what every layer does, a step's most
        if "layerdrop" in str(key) and isinstance(value, float) and value > 0:
            values[key] = 0.0
    if vision:
        staged = False
        for key in ("depths", "num_block_repeats", "num_layers_per_stage"):
            if isinstance(values.get(key), list):
                values[key] = [1 for _ in values[key]]
                staged = True
        if staged and _is_int(layers_before):
            # A model whose layer count is its stages (Swin's num_layers: its depths' length)
            # keeps them at a real depth: twelve stages would halve the image below a patch
            # and double the width eleven times (a Swin of 196,608 channels, killed for memory)
            depth = min(depth, layers_before)
        # Depth only: the widths a config names were made with its width coefficient.
        for key in ("depth_coefficient", "depth_multiplier"):
            if isinstance(values.get(key), float) and values[key] > 1:  # EfficientNet-B7's
                values[key] = 1.0
        if _is_int(values.get("image_size")) and values["image_size"] > IMAGE_SIZE:
            values["image_size"] = IMAGE_SIZE
        _shrink_counts(values, layers_before, depth)
        return values
    if factor is not None:
        for key, value in list(values.items()):
            if _is_width(key) and _is_int(value) and value >= SCALED_FROM:
                values[key] = value // factor
            elif _is_width(key) and isinstance(value, list) and value and \
                    all(_is_int(w) and w % factor == 0 for w in value) and \
                    sum(value) >= SCALED_FROM:
                values[key] = [w // factor for w in value]  # parts of a width, shrunk alike
    else:
        _shrink_fixed(values)
    _shrink_counts(values, layers_before, depth)
    _fit(values)
    _own_settings(values)
    return values


def _own_settings(values: dict) -> None:
    """What a few model types need that no rule gives: settings their model reads and their
    config class's defaults leave out (transformers cannot build those defaults either), or a
    length the model trains only at."""
    model_type = values.get("model_type")
    if model_type == "dbrx" and isinstance(values.get("attn_config"), dict):
        # DbrxAttention reads attn_config.rope_theta, which DbrxAttentionConfig no longer names
        # (published configs carry it there): the model's own theta; and it clamps to
        # clip_qkv, None by default, which torch refuses: the published models' 8
        attention = values["attn_config"]
        attention["rope_theta"] = values["rope_parameters"]["rope_theta"]
        if attention.get("clip_qkv") is None:
            attention["clip_qkv"] = 8
    elif model_type == "lfm2_moe" and values.get("layer_types") is None:
        # LFM2-MoE's class leaves layer_types None (LFM2's derives them) and its layers read it:
        # a short-convolution layer and an attention layer, the first dense as in the
        # published model, so the second is a mixture of experts
        layers = values["num_hidden_layers"]
        values["layer_types"] = ["conv" if i % 2 == 0 else "full_attention" for i in range(layers)]
        values["num_dense_layers"] = min(values["num_dense_layers"], layers - 1)
    elif model_type == "qwen4_exp_text" and values.get("indexer_head_dim") is None and \
            "indexed_attention" in values.get("layer_types", ()):
        # Qwen4-Exp's defaults name indexed-attention layers but leave their indexer's sizes
        # None: sizes of ours within its validator's rules (one key head, the budget a multiple
        # of the blocks, the head at least the rotary part of an attention head)
        values.update(indexer_n_heads=HEADS, indexer_kv_heads=1,
                      indexer_head_dim=values["head_dim"], indexer_budget=16,
                      indexer_compress_ratio=4)
    elif model_type == "reformer" and isinstance(values.get("axial_pos_shape"), list):
        # Reformer's axial positions train only on sequences of exactly their product: the
        # bench's sequence, a multiple of its attention chunks
        side = math.isqrt(SEQ_LEN)
        values["axial_pos_shape"] = [side, SEQ_LEN // side]
        values["max_position_embeddings"] = SEQ_LEN


def _first_int(values: dict, keys) -> tuple[str | None, int | None]:
    return next(((k, values[k]) for k in keys if _is_int(values.get(k))), (None, None))


def _fit(values: dict) -> None:
    """The config's own constraints, met by the small sizes: a number where the defaults leave
    None and the model reads one (a vocabulary, a head size, a router's experts and top-k),
    attention heads that divide the width (key-value heads the heads), a router's top-k no
    more than its experts."""
    for key in [k for k in values if str(k).endswith("vocab_size")]:
        if values[key] is None and key == "vocab_size":
            values[key] = VOCAB
    routed = any(k in values for k in _TOP_K_KEYS) and any(k in values for k in _EXPERT_KEYS)
    shared = [k for k in values if re.fullmatch(r"(n|num)_shared_experts", str(k))]
    for keys, size in ((_EXPERT_KEYS, EXPERTS), (_TOP_K_KEYS, EXPERTS_PER_TOKEN), (shared, 1)):
        for key in keys:
            if routed and key in values and values[key] is None:
                values[key] = size
    _, width = _first_int(values, _WIDTH_KEYS)
    head_key, heads = _first_int(values, _HEAD_KEYS)
    has_head_dim = any(_is_int(values.get(k)) for k in ("head_dim", "kv_channels"))
    if width and heads and width % heads and not has_head_dim:
        values[head_key] = heads = max(d for d in range(1, heads + 1) if width % d == 0)
    if width and heads and "head_dim" in values and values["head_dim"] is None:
        values["head_dim"] = width // heads
    for key in _KV_HEAD_KEYS:  # None: as many as the heads (Nemotron's model reads the None)
        if heads and key in values and values[key] is None:
            values[key] = heads
    kv_key, kv = _first_int(values, _KV_HEAD_KEYS)
    if heads and kv and heads % kv:
        values[kv_key] = math.gcd(heads, kv)
    if values.get("rope_parameters") == {}:  # a class that found no rope settings to standardize
        default = {"rope_type": "default", "rope_theta": 10_000.0}
        types = values.get("layer_types")
        # per layer type where the config names them (Cohere Compass's model reads
        # rope_parameters[layer_type], its class allowing a layer type without rope)
        values["rope_parameters"] = {str(t): dict(default) for t in dict.fromkeys(types)} \
            if isinstance(types, list) and types else default
    _, experts = _first_int(values, _EXPERT_KEYS)
    if experts:
        _shrink_int(values, _TOP_K_KEYS, experts)


def _shrink_fixed(values: dict) -> None:
    heads_before = next((values[k] for k in _HEAD_KEYS if _is_int(values.get(k))), None)
    kv_before = next((values[k] for k in _KV_HEAD_KEYS if _is_int(values.get(k))), None)
    width_before = next((values[k] for k in _WIDTH_KEYS if _is_int(values.get(k))), None)
    ffn_before = next((values[k] for k in _FFN_KEYS if _is_int(values.get(k))), None)
    _shrink_int(values, _WIDTH_KEYS, HIDDEN)
    # another stack's width that a stack names (BLT's local encoder and decoder name the global
    # transformer's, hidden_size_global): fixed alike, or the stacks meet in a matrix of the old
    # width ("mat1 and mat2 shapes cannot be multiplied (65x64 and 2048x128)")
    _shrink_int(values, [k for k in values if str(k).endswith("_global") and _is_width(k[:-7])],
                HIDDEN)
    _shrink_int(values, _FFN_KEYS, INTERMEDIATE)
    for key, value in list(values.items()):  # other sizes that were the width (a pooler's,
        # groups of channels as many as the width: Mimi's upsampling)
        if key.endswith(("_size", "_dim", "_embd", "_groups")) and _is_int(value):
            if value == width_before and width_before > HIDDEN:
                values[key] = HIDDEN
            elif value == ffn_before and ffn_before > INTERMEDIATE:
                values[key] = INTERMEDIATE
    _shrink_int(values, _EXPERT_FFN_KEYS, EXPERT_INTERMEDIATE)
    _shrink_int(values, _HEAD_KEYS, HEADS)
    grouped = _is_int(kv_before) and _is_int(heads_before) and kv_before < heads_before
    _shrink_int(values, _KV_HEAD_KEYS, min(KV_HEADS if grouped else HEADS,
                                           kv_before if _is_int(kv_before) else HEADS))
    _shrink_int(values, _HEAD_DIM_KEYS, HEAD_DIM)
    _shrink_int(values, ("qk_rope_head_dim", "rotary_dim"), HEAD_DIM // 2)
    _shrink_int(values, ("qk_nope_head_dim",), HEAD_DIM)
    _shrink_int(values, ("kv_lora_rank",), HEAD_DIM)
    _shrink_int(values, ("q_lora_rank",), 2 * HEAD_DIM)
    if "qk_head_dim" in values and _is_int(values.get("qk_nope_head_dim")):
        values["qk_head_dim"] = values["qk_nope_head_dim"] + values.get("qk_rope_head_dim", 0)


def _text_width(values: dict) -> int | None:
    """The width of a config's text model (its own, else its text_config's)."""
    for config in (values, values.get("text_config")):
        if isinstance(config, dict):
            _, width = _first_int(config, _WIDTH_KEYS)
            if width:
                return width
    return None


def _follow_text_width(values: dict, before: int, after: int, inside: bool = False) -> None:
    """Another tower's projection into the text model (a vision adapter's output width, a
    vision tower's out_hidden_size) keeps the text width it was made for: the towers keep their
    own widths, the text shrinks."""
    for key, value in values.items():
        if isinstance(value, dict) and key != "text_config":
            _follow_text_width(value, before, after, True)
        elif inside and value == before and _is_int(value) and \
                any(word in str(key) for word in ("out", "text", "proj")):
            values[key] = after


def _derived(config_class, values: dict) -> set[str]:
    """The sizes the config class derives from its width (Zamba2's mamba_headdim, expand ×
    width / heads): left out of the small config, for the class to derive from the small width
    (a derived size's name may be none of the widths shrunk)."""
    key, width = _first_int(values, _WIDTH_KEYS)
    if key is None:
        return set()
    try:
        wider = config_class(**{key: width * 2}).to_dict()
    except Exception:  # noqa: BLE001 - a width the class's checks refuse doubled: none known
        return set()
    return {k for k, v in wider.items() if k != key and k in values and _is_int(v)
            and v != values[k]}


def small_config(model_type: str, head: str, scaled: bool = True, depth: int = LAYERS) -> dict:
    """The model type's config class defaults, shrunk, as a config.json holds it, naming the
    head to train. `scaled`: widths divided by a common factor (`scale_factor`); else set to
    small fixed sizes. `depth`: the layers of each stack (DEEP: the class's own pattern of
    layers kept, at that depth)."""
    from transformers import CONFIG_MAPPING

    from anatomy.analysis import models

    values = CONFIG_MAPPING[model_type]().to_dict()
    derived = _derived(CONFIG_MAPPING[model_type], values)
    vision = models.head_task(head) == models.IMAGE_CLASSIFICATION
    text_before = _text_width(values)
    values = _shrink(values, vision, scale_factor(values) if scaled else None, depth)
    if not vision and text_before and _text_width(values) != text_before:
        _follow_text_width(values, text_before, _text_width(values))
    for key in ("transformers_version", "_name_or_path", "torch_dtype", "dtype", *derived):
        values.pop(key, None)
    values["model_type"] = model_type
    values["architectures"] = [head]
    return json.loads(json.dumps(values, default=str))


def trains(path: Path) -> str | None:
    """None when the config's model builds and takes one forward and backward pass on the CPU
    (batch 1, the bench's sequence: some models train only at some lengths); else why not, in
    one line."""
    import torch

    from anatomy.analysis import models
    from anatomy.prediction.tracing.trainer_step import make_batch

    try:
        spec = models.resolve(str(path))
        model, _ = models.build_model(spec, "cpu", pretrained=False)
        model.config.use_cache = False  # as the Trainer sets it
        model.train()
        loss = model(**make_batch(spec, 1, SEQ_LEN))["loss"]
        loss.backward()
        return None if torch.isfinite(loss).item() else "the loss is not finite"
    except Exception as error:  # noqa: BLE001 - a config transformers' model cannot run
        return _one_line(error)


def _lift_missing(config: dict, reason: str | None) -> bool:
    """A setting the model reads from its config where the config class keeps it only in a part
    (Moonshine Streaming's decoder reads num_key_value_heads, which only its encoder_config
    holds): the part's value, lifted to the top. Whether one was."""
    missing = re.search(r"object has no attribute '(\w+)'", reason or "")
    if missing is None or missing[1] in config:
        return False
    found = next((part[missing[1]] for part in config.values()
                  if isinstance(part, dict) and missing[1] in part), None)
    if found is None:
        return False
    config[missing[1]] = found
    return True


def working_config(model_type: str, head: str, directory: Path) -> tuple[Path, str, str | None]:
    """The small config that trains: widths scaled first, else fixed small widths; (its path,
    how it was shrunk, why neither trains or None)."""
    reasons = {}
    for how in ("scaled", "fixed"):  # a folder each: a file rewritten is another model
        path = directory / how / f"{model_type}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        config = small_config(model_type, head, how == "scaled")
        path.write_text(json.dumps(config, indent=1))
        reasons[how] = trains(path)
        if _lift_missing(config, reasons[how]):
            path.write_text(json.dumps(config, indent=1))
            reasons[how] = trains(path)
        if reasons[how] is None:
            return path, how, None
    return directory / "scaled" / f"{model_type}.json", "scaled", reasons["scaled"]


# The most parameters a saved config is trained with its widths scaled; beyond, its widths are
# set to the fixed small sizes: a scaled Granite Speech at 12 layers keeps its 4,096-wide text
# model (2.9 B parameters, 46 GB of fp32 weights, gradients and AdamW's two states: killed for
# memory on the bench's 24 GiB machine), a scaled BLT 1.1 B (no answer in 900 s).
LARGEST = 500_000_000


def parameters(folder: Path) -> int:
    """The parameters of the model a config folder builds, counted on the meta device (nothing
    allocated); 0 where it cannot be built there (its training says why)."""
    from anatomy.analysis import models

    try:
        model, _ = models.build_model(models.resolve(str(folder)), "meta", pretrained=False)
    except Exception:  # noqa: BLE001 - `trains` builds it for real and gives its one line
        return 0
    return sum(p.numel() for p in model.parameters())


def saved_config(model_type: str, head: str, directory: Path) -> tuple[Path, str, str | None]:
    """The small config at DEEP layers as a user has it: the config class made from it, then
    written by transformers' own `save_pretrained` into a model folder (its per-layer lists
    written out, one entry per layer); widths scaled first (up to LARGEST parameters), else
    fixed. (The folder, how it was shrunk, why neither trains or None.)"""
    from transformers import AutoConfig

    reasons: dict[str, str | None] = {}
    fallback = "scaled"  # the folder measured where neither trains: the scaled, unless too large
    for how in ("scaled", "fixed"):
        folder = directory / f"saved-{how}" / model_type
        try:
            values = small_config(model_type, head, how == "scaled", DEEP)
            for _ in range(2):  # again with a setting lifted from a part (`_lift_missing`)
                values.pop("model_type", None)
                AutoConfig.for_model(model_type, **values).save_pretrained(folder)
                size = parameters(folder) if how == "scaled" else 0
                if size > LARGEST:
                    reasons[how], fallback = (f"{size:,} parameters, more than the bench "
                                              f"trains ({LARGEST:,})"), "fixed"
                    break
                reasons[how] = trains(folder)
                if not _lift_missing(values, reasons[how]):
                    break
        except Exception as error:  # noqa: BLE001 - a class that refuses its deep defaults
            reasons[how] = _one_line(error)
            continue
        if reasons[how] is None:
            return folder, how, None
    if not (directory / f"saved-{fallback}" / model_type / "config.json").exists():
        raise ValueError(reasons[fallback])
    return directory / f"saved-{fallback}" / model_type, fallback, reasons[fallback]


def write_configs(directory: Path, token_heads: bool = False) -> list[tuple[str, str, Path]]:
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for model_type, head in architectures(token_heads):
        path = directory / f"{model_type}.json"
        try:
            path.write_text(json.dumps(small_config(model_type, head), indent=1))
        except Exception as error:  # noqa: BLE001 - a config class that cannot be defaulted
            print(f"{model_type}: no default config: {type(error).__name__}: {error}")
            continue
        out.append((model_type, head, path))
    return out


# --- one architecture: predictions and a run (in a child process) ---

MIB = 2**20
H200 = "NVIDIA H200"
BATCH, SEQ_LEN, STEPS, LORA_RANK = 2, 64, 2, 8
# (name, device, changes to the options): the modes each architecture is predicted in.
MODES = (
    ("cpu", "cpu", {}),
    ("h200 bf16", "cuda", {"precision": "bf16"}),
    ("h200 fp32 ckpt", "cuda", {"gradient_checkpointing": True}),
    ("h200 lora", "cuda", {"precision": "bf16", "lora_rank": LORA_RANK}),
)
COMPARED = ("weights", "gradients", "optimizer_states", "activations")


def _options(config_path: Path, **changes):
    from anatomy.analysis.options import RunOptions

    return RunOptions(model=str(config_path), batch_size=BATCH, seq_len=SEQ_LEN,
                      dataset_size=BATCH * STEPS, max_steps=STEPS, **changes)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def _predict(options, device: str) -> dict:
    """As `anatomy predict` does it: validation, then the prediction; a refusal is one line."""
    from anatomy import prediction
    from anatomy.analysis.options import validate

    errors = validate(options, 1 if device == "cuda" else 0)
    if errors:
        return {"status": "refused", "line": "; ".join(errors.values())}
    try:
        predicted = prediction.predict(options, device=device,
                                       gpu_name=H200 if device == "cuda" else None)
    except prediction.PredictionError as error:
        return {"status": "refused", "line": str(error)}
    out = {"status": "predicted", "peak": predicted.peak,
           "parameters": predicted.parameters, **{k: getattr(predicted, k) for k in COMPARED}}
    if device == "cuda":
        out.update(nvml_peak=predicted.nvml_peak, kernels=sorted(set(predicted.attention_kernels)))
    return out


def _run(options) -> dict:
    """A real CPU run of the options: the worker's own training code (the Trainer, the dummy
    dataset, the component probe) in this process; what the probe measured."""
    import time

    from anatomy.analysis.options import validate
    from anatomy.engine import protocol, worker
    from anatomy.store import Components

    errors = validate(options, 0)
    if errors:
        return {"status": "refused", "line": "; ".join(errors.values())}
    messages: list = []

    class Queue(list):
        put = list.append

    queue = Queue()
    code = worker.train(queue, options, time.monotonic(), False, 0.0)
    messages = list(queue)
    failure = next((m for m in messages if isinstance(m, protocol.Failure)), None)
    if code or failure is not None:
        return {"status": failure.status if failure else "failed",
                "line": (failure.text.strip().splitlines() or [""])[-1][:300] if failure else ""}
    measured = next((m.components for m in messages
                     if isinstance(m, protocol.ComponentsMeasured)), Components())
    return {"status": "completed", **{k: measured.get(k) for k in COMPARED}}


# The modes a saved config at a real depth is predicted in: the CPU, and the H200 as
# `predict --device cuda --gpu-model 'NVIDIA H200'` does it (no GPU used).
SAVED_MODES = MODES[:2]


def measure(model_type: str, head: str, directory: Path, saved: bool = False) -> dict:
    """Every mode's prediction, the CPU run, and whether the CPU's figures agree, for the config
    `working_config` writes; `saved`: for the config at DEEP layers as save_pretrained writes it
    (`saved_config`), predicted on the CPU and for the H200, with the layers the depth stand-in
    traced (prediction/recordings.py)."""
    import time

    row: dict = {"model_type": model_type, "head": head, **({"saved": True} if saved else {})}
    started = time.monotonic()
    try:
        path, row["shrunk"], untrainable = (saved_config if saved else working_config)(
            model_type, head, directory)
    except Exception as error:  # noqa: BLE001 - a config class without usable defaults
        row.update(config=_one_line(error), seconds=0.0)
        return row
    if untrainable:
        row["untrainable"] = untrainable
    row.update(_depth(path) if saved else _task(path))
    for name, device, changes in SAVED_MODES if saved else MODES:
        try:
            row[name] = _predict(_options(path, **changes), device)
        except Exception as error:  # noqa: BLE001 - a traceback a user would meet: a defect
            row[name] = {"status": "traceback", "line": _one_line(error)}
    try:
        row["run"] = _run(_options(path))
    except Exception as error:  # noqa: BLE001
        row["run"] = {"status": "traceback", "line": _one_line(error)}
    row["seconds"] = round(time.monotonic() - started, 1)
    return row


def _task(path: Path) -> dict:
    """The head the config's architectures choose (None: it resolves to none)."""
    from anatomy.analysis import models

    try:
        return {"task": models.resolve(str(path)).task}
    except models.ModelError:
        return {"task": None}


def _depth(folder: Path) -> dict:
    """The saved config's layers and those the depth stand-in traced (None: in full), or why
    there is no stand-in (the predictions say it in their line too)."""
    from anatomy.analysis import models
    from anatomy.prediction import layers, recordings

    row: dict = {}
    try:
        spec = models.resolve(str(folder))
        row["layers"] = layers.depth_of(dict(spec.config))
        found = recordings.stand_in(spec)
        row["traced"] = len(found.repeats.kept) if found else None
    except Exception as error:  # noqa: BLE001 - the predictions below say it in their line
        row["traced"] = None
        row["stand_in"] = _one_line(error)
    return row


ROW = "coverage-row "  # what marks a result among whatever a model prints


def serve(directory: Path) -> None:
    """A child's loop: a model type and head per line in, a JSON row per line out."""
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    for line in sys.stdin:
        model_type, head, *deep = line.split()
        row = measure(model_type, head, directory, saved=bool(deep))
        print(ROW + json.dumps(row, default=str), flush=True)


# --- the parent: children with a time limit each, results as they come ---

def child_environment(jobs: int) -> dict[str, str]:
    """A child's environment: no GPU visible (the CPU half of the table is the CPU's, also on a
    machine with torch's CUDA build and a GPU; the H200 figures are predictions, no GPU used), and
    the machine's cores shared among the children (torch would take them all in each)."""
    import os

    threads = str(max(1, (os.cpu_count() or 1) // max(jobs, 1)))
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads}


class Child:
    """A `--serve` process and the architecture it is on."""

    def __init__(self, directory: Path, log, environment: dict[str, str]):
        import subprocess

        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(directory)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1, cwd=ROOT,
            env=environment)
        self.task: tuple[str, ...] | None = None
        self.since = 0.0

    def give(self, task: tuple[str, ...]) -> None:
        import time

        self.task, self.since = task, time.monotonic()
        self.process.stdin.write(" ".join(task) + "\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def run_all(tasks: list[tuple[str, ...]], out: Path, jobs: int, timeout: float) -> None:
    import shutil
    import tempfile

    out.parent.mkdir(parents=True, exist_ok=True)
    done = {json.loads(line)["model_type"] for line in out.read_text().splitlines()
            if line.strip()} if out.exists() else set()
    pending = [t for t in tasks if t[0] not in done]
    print(f"{len(tasks)} architectures, {len(done)} done before, {len(pending)} to go", flush=True)
    directory = Path(tempfile.mkdtemp(prefix="anatomy-coverage-"))
    try:
        _run_children(pending, out, jobs, timeout, directory)
    finally:  # the children's config files: none left behind, however the bench ends
        shutil.rmtree(directory, ignore_errors=True)


def _run_children(pending: list[tuple[str, ...]], out: Path, jobs: int, timeout: float,
                  directory: Path) -> None:
    """The pending tasks over `jobs` children in `directory`, each row written as it comes."""
    import selectors
    import time

    log = open(out.with_suffix(".log"), "a")  # noqa: SIM115 - the children's stderr, all run
    environment = child_environment(jobs)
    children = [Child(directory, log, environment) for _ in range(min(jobs, len(pending)))]
    selector = selectors.DefaultSelector()
    for child in children:
        selector.register(child.process.stdout, selectors.EVENT_READ, child)

    def record(row: dict) -> None:
        with out.open("a") as file:
            file.write(json.dumps(row, default=str) + "\n")
        print(f"{row['model_type']:28} {_summary(row)}", flush=True)

    def replace(child: Child) -> Child:
        selector.unregister(child.process.stdout)
        child.stop()
        fresh = Child(directory, log, environment)
        selector.register(fresh.process.stdout, selectors.EVENT_READ, fresh)
        children[children.index(child)] = fresh
        return fresh

    try:
        for child in children:
            if pending:
                child.give(pending.pop(0))
        while any(c.task for c in children):
            for key, _ in selector.select(timeout=5):
                child = key.data
                line = child.process.stdout.readline()
                if not line:  # the child died (a crash in native code, memory)
                    if child.task:
                        record({"model_type": child.task[0], "head": child.task[1],
                                "saved": len(child.task) > 2,
                                "crashed": f"exit {child.process.poll()}"})
                    child = replace(child)
                elif line.startswith(ROW):
                    record(json.loads(line[len(ROW):]))
                    child.task = None
                else:
                    continue
                if pending:
                    child.give(pending.pop(0))
            for child in list(children):
                if child.task and time.monotonic() - child.since > timeout:
                    record({"model_type": child.task[0], "head": child.task[1],
                            "saved": len(child.task) > 2,
                            "crashed": f"no answer in {timeout:.0f} s"})
                    fresh = replace(child)
                    if pending:
                        fresh.give(pending.pop(0))
    finally:  # however it ends (Ctrl-C too), no child outlives the bench
        for child in children:
            child.stop()
        log.close()


def _summary(row: dict) -> str:
    if row.get("crashed") or row.get("config"):
        return row.get("crashed") or f"no config: {row['config']}"
    modes = SAVED_MODES if row.get("saved") else MODES
    parts = [f"{name}: {row[name]['status']}" for name, _, _ in modes] + \
        [f"run: {row['run']['status']}", f"{row.get('seconds')} s"]
    if row.get("saved"):
        parts.insert(0, f"traced {row.get('traced') or 'all'} of {row.get('layers')}")
    return ", ".join(parts)


# --- the report: docs/COVERAGE.md ---

def verdict(row: dict) -> str:
    """"predicted", "refused" or "traceback" for an architecture: its CPU prediction made, or
    refused in one line; a traceback (or a crash, a hang) anywhere counts against it."""
    if row.get("crashed") or any(row.get(name, {}).get("status") == "traceback"
                                 for name in [m[0] for m in MODES] + ["run"]):
        return "traceback"
    if row.get("config"):
        return "no config"
    if row["cpu"]["status"] == "predicted":
        return "predicted"
    return "untrainable" if row.get("untrainable") else "refused"


def exact(row: dict) -> bool | None:
    """Whether the CPU prediction equals what the probe measured on the CPU run (None: no run to
    compare with)."""
    cpu, run = row.get("cpu", {}), row.get("run", {})
    if cpu.get("status") != "predicted" or run.get("status") != "completed":
        return None
    return all(cpu[k] == run[k] for k in COMPARED)


def _cell(result: dict | None) -> str:
    if not result:
        return ""
    status = result["status"]
    if status in ("predicted", "completed"):
        return "✓"
    line = str(result.get("line", "")).replace("|", "\\|").replace("\n", " ")
    return f"{'**' + status + '**' if status == 'traceback' else status}: {line[:160]}"


def _saved_cell(row: dict | None) -> str:
    """A saved config's column: its CPU prediction against its CPU run, the layers the stand-in
    traced (of DEEP), the H200's prediction where it differs; or what it answered."""
    if not row:
        return ""
    if row.get("crashed") or row.get("config"):
        return f"**{row.get('crashed') or 'no config: ' + row['config']}**"
    traced = f"{row['traced']} of {row['layers']} traced" if row.get("traced") else "in full"
    if row["cpu"]["status"] != "predicted":
        return f"{_cell(row['cpu'])} (run: {_cell(row.get('run'))})"
    same = exact(row)
    words = ["exact" if same else "≠ run" if same is False else f"run: {_cell(row.get('run'))}",
             traced]
    if row["h200 bf16"]["status"] != "predicted":
        words.append(f"H200 {_cell(row['h200 bf16'])}")
    return "✓ " + ", ".join(words)


# Why a saved config's CPU prediction and its CPU run differ, where the difference is the run's
# and not the prediction's (the figures are the rows').
APART = {
    "longcat_flash": (
        "its mixture of experts sends each token to 2 of 4 experts that compute and 4 "
        "zero-compute (identity) ones, and random weights route as they fall, differently in "
        "each run; the trace routes evenly (tracing/values.py), half the choices to identity "
        "experts. A choice of an expert that computes saves 1,792 bytes more than an identity's "
        "(its input, gate-up output, activation and product: 448 fp32 values at this width), so "
        "the run's activations move by 1,792 bytes for each choice the routing gives an "
        "identity expert beyond half (-114,688: 64 more of the 3,072 over 12 layers). Runs of "
        "the same config measured 109,871,880 (1,581 identity choices) and 110,226,696 (1,383); "
        "one whose router was made to route as the trace does (`get_topk_indices` replaced by "
        "the even split) measured 109,952,520, the prediction to the byte"),
}


def _apart(row: dict) -> str:
    """The components in which a row's CPU prediction and CPU run differ, in bytes."""
    return ", ".join(f"{k} {row['run'][k] - row['cpu'][k]:+,} B measured" for k in COMPARED
                     if row["cpu"][k] != row["run"][k])


def _saved_section(saved: list[dict], command: str, enumerated: list[tuple[str, str]]) -> list[str]:
    """What the saved configs at a real depth came to: totals, refusals next to the run's, the
    rows apart from their run and why, the crashes."""
    measured = [r for r in saved if not (r.get("crashed") or r.get("config"))]
    crashed = [r for r in saved if r.get("crashed")]
    fixed = sorted(r["model_type"] for r in measured if r.get("shrunk") == "fixed")
    missing = sorted({t for t, _ in enumerated} - {r["model_type"] for r in saved})
    no_config = len(saved) - len(measured) - len(crashed)
    cpu = [r for r in measured if r["cpu"]["status"] == "predicted"]
    h200 = [r for r in measured if r["h200 bf16"]["status"] == "predicted"]
    shorter = [r for r in cpu if r.get("traced")]
    compared = [r for r in saved if exact(r) is not None]
    refused = [r for r in measured if r["cpu"]["status"] != "predicted"]
    # the stand-in's own refusal: the config class refusing the prediction a config the run
    # trains (its validation, transformers' checks included, passed)
    stand_in = [r for r in refused if "refuses the config" in r["cpu"].get("line", "")
                and r.get("run", {}).get("status") == "completed"]
    alike = [r for r in refused if r.get("run", {}).get("status") == "refused"
             and r["run"].get("line") == r["cpu"].get("line")]
    return [
        "## At a real depth: configs as save_pretrained writes them", "",
        f"Each architecture's small config again with {DEEP} layers in each stack (the class's "
        "own pattern of layers kept: its first layers' kinds in order; defaults of fewer layers "
        "raised, a list per layer repeated), made into its config class and written by "
        "transformers' own `save_pretrained` into a model folder, per-layer lists (layer_types, "
        "mlp_layer_types, no_rope_layers, per_layer_config, stage_names …) written out as "
        "users have them; vision models whose depth is stages keep their one block a stage. "
        "Predicted on the CPU and for the H200 (bf16, as `predict --device cuda --gpu-model "
        "'NVIDIA H200'` does it, no GPU used), then trained for two steps on the CPU; the depth "
        "stand-in (prediction/blocks.py, recordings.stand_in) traces the first layers, two "
        "periods and the last period where the layers repeat four times or more, and the rest "
        "in full. Written by", "",
        f"    {command}", "",
        f"- architectures enumerated: {len(enumerated)}; measured: {len(saved)}"
        + (f" (no config: {no_config})" if no_config else "")
        + (f"; not yet measured ({len(missing)}): {', '.join(missing)}" if missing else ""),
        f"- crashed or no answer in the time limit: {len(crashed)}"
        + "".join(f"; {r['model_type']} ({r['crashed']})" for r in crashed),
        f"- widths fixed, not scaled ({len(fixed)}: the scaled config does not train, or makes "
        f"more than {LARGEST:,} parameters at this depth): {', '.join(fixed)}",
        f"- predicted on the CPU: {len(cpu)}; for the H200: {len(h200)}",
        f"- traced at fewer layers than {DEEP} by the stand-in: {len(shorter)} (the others "
        "in full: layers that repeat fewer than four times at this depth, stacks in "
        "sub-configs, a part outside the layers that grows with the depth)",
        f"- CPU prediction = CPU measurement (all four components, to the byte): "
        f"{sum(1 for r in compared if exact(r))} of {len(compared)} compared"
        + "".join(f"; {r['model_type']}: {_apart(r)}" for r in compared if not exact(r)),
        *[f"  - why {r['model_type']}: {APART[r['model_type']]}" for r in compared
          if not exact(r) and r["model_type"] in APART],
        f"- refused by the prediction: {len(refused)}; of them refused by `run` in the same "
        f"line: {len(alike)}; refused by the config class for the stand-in while the run "
        f"trains: {len(stand_in)}", "",
        *[f"- {r['model_type']}: {r['cpu'].get('line', '')} — run: "
          f"{r.get('run', {}).get('status')}" for r in refused], ""]


def report(rows: list[dict], command: str, enumerated: list[tuple[str, str]],
           token_heads: bool = False, saved: list[dict] = (), saved_command: str = "") -> str:
    """docs/COVERAGE.md from the rows measured so far; `enumerated`: every architecture, those
    not yet measured named (a later call of the command measures them, skipping the rest);
    `token_heads`: docs/COVERAGE-TOKENS.md, the types' token-classification heads; `saved`:
    the rows of the saved configs at a real depth (`--saved`), a column and a section."""
    import datetime
    from collections import Counter

    import torch
    import transformers

    verdicts = Counter(verdict(r) for r in rows)
    compared = [r for r in rows if exact(r) is not None]
    equal = sum(1 for r in compared if exact(r))
    total = len(rows)
    measured = {row["model_type"] for row in rows}
    missing = [model_type for model_type, _ in enumerated if model_type not in measured]
    which = (
        "The architectures are the model types of transformers' own auto mappings for causal-LM, "
        "image-text-to-text (trained as causal LMs on text alone), sequence-classification, "
        "image-classification and sequence-to-sequence heads; each "
        "trains the head `models.task_of` picks for its type (token-classification heads train "
        "where a config's `architectures` names one and are no type's default: "
        "docs/COVERAGE-TOKENS.md tries each type's). ")
    if token_heads:
        which = (
            "The architectures are the model types of transformers' own token-classification "
            "table (MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES), each with its "
            "…ForTokenClassification head named in `architectures`, as an NER model's config "
            "names it (no type's default: docs/COVERAGE.md has the types' own heads); a class "
            "for every token, the config class's default labels. ")
    lines = [
        "# Coverage: every architecture transformers ships with a "
        + ("token-classification head" if token_heads else "head anatomy trains"), "",
        f"transformers {transformers.__version__}, torch {torch.__version__}, Python "
        f"{sys.version.split()[0]}, on a CPU; written {datetime.date.today().isoformat()} by", "",
        f"    {command}", "",
        which + "Its config is the config class's "
        f"defaults, shrunk (bench/architectures.py: {LAYERS} layers, hidden size {HIDDEN}, a "
        f"{VOCAB}-token vocabulary, {EXPERTS} experts; vision models keep their stages, one "
        "block each; the sizes meet the config's own constraints: heads that divide the width, "
        "a router's top-k within its experts, a number where the defaults leave None, "
        "sub-configs and per-layer settings shrunk alike; LayerDrop off, so that every layer "
        "runs in the step measured, as in the step predicted; four model types get settings of "
        "their own that their config class's defaults leave out, each with why: "
        "`_own_settings`). "
        "Each is predicted on the CPU (fp32) "
        "and for the calibrated H200 (bf16; "
        "fp32 with gradient checkpointing; LoRA rank 8 in bf16) as `anatomy predict` does it "
        "(validation, then the prediction), then trained for two steps on the CPU by the "
        "worker's own training code, and the CPU prediction is held against what the component "
        f"probe measured: weights, gradients, optimizer states and activations, to the byte "
        f"(batch {BATCH}, sequence {SEQ_LEN}, AdamW).", "",
        "## Totals", "",
        f"- architectures enumerated: {len(enumerated)}; measured: {total}"
        + (f"; not yet measured ({len(missing)}, the command goes on from where it stopped): "
           + ", ".join(missing) if missing else ""),
        f"- predicted on the CPU: {verdicts['predicted']} "
        f"({100 * verdicts['predicted'] / max(total, 1):.1f} %)",
        f"- refused in one line: {verdicts['refused']}",
        f"- refused in one line, and no small config of its defaults trains for real either: "
        f"{verdicts['untrainable']}",
        f"- tracebacks, crashes or hangs: {verdicts['traceback']}",
        f"- configs transformers' defaults cannot make: {verdicts['no config']}",
        f"- CPU prediction = CPU measurement (all four components, to the byte): {equal} of "
        f"{len(compared)} compared", "",
        "## Why the refused are refused", "",
        *[f"- {row['model_type']}: {row['cpu'].get('line', '')}" for row in
          sorted(rows, key=lambda r: r["model_type"])
          if verdict(row) in ("refused", "untrainable")], "",
        *(_saved_section(saved, saved_command, enumerated) if saved else []),
        "## Every architecture", "",
        "✓: predicted (or trained); otherwise the one line it answered. *exact*: the CPU "
        "prediction equals the CPU measurement."
        + (f" *{DEEP} layers, saved*: the config at {DEEP} layers as save_pretrained writes it, "
           "its CPU prediction against its CPU run and the layers the stand-in traced."
           if saved else ""), "",
        "| model type | head | parameters | CPU | H200 bf16 | H200 fp32 ckpt | H200 LoRA | CPU run "
        "| predicted = measured |" + (f" {DEEP} layers, saved |" if saved else ""),
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if saved else "")]
    by_type = {row["model_type"]: row for row in saved}
    for row in sorted(rows, key=lambda r: r["model_type"]):
        deep = [_saved_cell(by_type.get(row["model_type"]))] if saved else []
        if row.get("crashed") or row.get("config"):
            lines.append(f"| {row['model_type']} | {row.get('head', '')} | | "
                         f"**{row.get('crashed') or 'no config: ' + row['config']}** | | | | | |"
                         + "".join(f" {cell} |" for cell in deep))
            continue
        same = exact(row)
        diff = "" if same is None else "exact" if same else ", ".join(
            f"{k} {row['cpu'][k] - row['run'][k]:+,} B" for k in COMPARED
            if row['cpu'][k] != row['run'][k])
        parameters = row["cpu"].get("parameters")
        lines.append(" | ".join([
            f"| {row['model_type']}", row["head"],
            f"{parameters:,}" if parameters else "",
            *(_cell(row.get(name)) for name, _, _ in MODES), _cell(row.get("run")),
            diff, *deep]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=Path, help="only write the small configs here")
    parser.add_argument("--only", help="comma-separated model types")
    parser.add_argument("--token-heads", action="store_true",
                        help="each type's token-classification head (default --out and --doc: "
                             "docs/data/coverage-tokens.jsonl, docs/COVERAGE-TOKENS.md)")
    parser.add_argument("--saved", action="store_true",
                        help=f"the column of configs at {DEEP} layers as save_pretrained writes "
                             "them (default --out: docs/data/coverage-saved.jsonl; the report "
                             "is docs/COVERAGE.md, with both)")
    parser.add_argument("--part", help="K/N: the K-th of N equal parts of the architectures "
                                       "(machines or sessions that share the work)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--jobs", type=int, default=1, help="architectures at once")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per architecture")
    parser.add_argument("--report", action="store_true", help="only write the report")
    parser.add_argument("--doc", type=Path)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    suffix = "-tokens" if args.token_heads else ""
    args.out = args.out or ROOT / "docs" / "data" / \
        f"coverage{'-saved' if args.saved else suffix}.jsonl"
    args.doc = args.doc or ROOT / "docs" / f"COVERAGE{suffix.upper()}.md"
    if args.serve:
        serve(args.serve)
        return 0
    if args.configs:
        for model_type, head, path in write_configs(args.configs, args.token_heads):
            print(f"{model_type:32} {head:48} {path}")
        return 0
    command = args.out.with_suffix(".command")  # the command that measured, for --report
    if not args.report:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        command.write_text(f"python bench/architectures.py "
                           f"{'--token-heads ' if args.token_heads else ''}"
                           f"{'--saved ' if args.saved else ''}--jobs {args.jobs} "
                           f"--timeout {args.timeout:g}"
                           + (f" --only {args.only}" if args.only else "")
                           + (f" --part {args.part}" if args.part else ""))
        tasks = architectures(args.token_heads)
        if args.only:
            wanted = set(args.only.split(","))
            tasks = [t for t in tasks if t[0] in wanted]
        if args.part:
            part, parts = map(int, args.part.split("/"))
            tasks = tasks[part - 1::parts]
        if args.saved:
            tasks = [(model_type, head, "saved") for model_type, head in tasks]
        run_all(tasks, args.out, args.jobs, args.timeout)

    def latest(path: Path) -> list[dict]:  # a type run again: its latest row
        found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] \
            if path.exists() else []
        return list({row["model_type"]: row for row in found}.values())

    main_out = args.out.with_name("coverage.jsonl") if args.saved else args.out
    saved_out = args.out if args.saved else args.out.with_name("coverage-saved.jsonl")
    made_by = {path: path.with_suffix(".command").read_text().strip()
               if path.with_suffix(".command").exists() else "python bench/architectures.py"
               for path in (main_out, saved_out)}
    args.doc.write_text(report(latest(main_out), made_by[main_out],
                               architectures(args.token_heads), args.token_heads,
                               [] if args.token_heads else latest(saved_out),
                               made_by[saved_out]))
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

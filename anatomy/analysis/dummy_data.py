"""One sample of the dummy data, tensor by tensor: what a model's forward takes for its task, by
name and shape. Read from the model's config and from transformers' own word on the model: the
head class's `main_input_name` (token ids, pixel values, a raw waveform, log-mel features) and
its forward's parameters. The run's dataset (engine/dataset.py) and the prediction's batch
(prediction/tracing/trainer_step.py) fill the same layout, so both hand the model the same tensors.

- text: token ids (a causal LM's labels are the same ids; a classifier's one label; a token
  classifier's a class for every token: no -100 among them, since every dummy sequence is
  `seq_len` long and a collator pads none, and the loss's cross entropy runs over every position
  whatever its label — a tokenizer's -100 on its special tokens would change no tensor's size);
- several codebooks per position (MusicGen: its forward takes `num_codebooks` sequences per
  sample, and labels per position and codebook): the ids of every codebook;
- images: pixel values of the config's size; patches where the forward takes them with their
  grid (SigLIP 2: `pixel_attention_mask`, `spatial_shapes`); the pixels' cluster ids where the
  model reads an image as tokens (ImageGPT);
- an image the text follows without a token for it (GIT: its loss skips the image's positions):
  pixel values beside the ids; audio in step with the text (Voxtral Realtime): its features;
- speech: a raw waveform (`input_values`: Moonshine, SpeechT5, a wav2vec2 encoder) of
  `FRAME_SAMPLES` samples per sequence position, or log-mel features (Whisper's, Speech2Text's,
  a Parakeet encoder's);
- an encoder-decoder: the decoder's inputs are its labels shifted right behind the start token,
  as DataCollatorForSeq2Seq makes them.
"""

from __future__ import annotations

import inspect
import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache

from anatomy.analysis import models
from anatomy.analysis.models import (
    CAUSAL_LM,
    IMAGE_CLASSIFICATION,
    MASKED_LM,
    SEQ2SEQ,
    SEQUENCE_CLASSIFICATION,
    TOKEN_CLASSIFICATION,
    ModelError,
    ModelSpec,
)

# A raw waveform's samples per sequence position: 20 ms at 16 kHz, the frame of wav2vec2's and
# SpeechT5's feature encoders (their convolutions' strides multiply to 320).
FRAME_SAMPLES = 320

# How a tensor is filled.
TOKENS = "tokens"  # token ids in the dummy data's range (`models.token_range`)
NOISE = "noise"  # standard normal floats: pixels, waveforms, features
ONES = "ones"  # a mask that keeps everything
VALUES = "values"  # the entries `Tensor.values` gives (a grid's shape)
CLASS = "class"  # labels below the head's number of labels: one, or one per token
MULTI_HOT = "multi-hot"  # 0.0 or 1.0 for each of the head's labels (several labels per sample)
COPY = "copy"  # another tensor's (`source`), transposed where `transpose`
SHIFTED = "shifted"  # another tensor's ids (`source`) shifted right behind the start token


@dataclass(frozen=True)
class Tensor:
    """One tensor of a sample: its shape (a batch stacks samples before it) and its filling."""
    shape: tuple[int, ...]
    fill: str
    source: str | None = None  # COPY, SHIFTED: the tensor it is made from
    transpose: bool = False  # COPY: the source's two dimensions swapped
    values: tuple[int, ...] = ()  # VALUES
    tokens: tuple[int, int] | None = None  # TOKENS: their range where not the sample's
    last: int | None = None  # TOKENS: the token at the last position, where one is set


@dataclass(frozen=True)
class Sample:
    """What one sample holds, by the forward's names, in the order they are made (a tensor made
    from another after it); the token range, labels and start token they are filled with."""
    tensors: tuple[tuple[str, Tensor], ...]
    low: int
    high: int
    num_labels: int
    start_token: int
    words: str  # what a sample is, in words ("images 224×224", "audio 20,480 samples, …")


def sample(spec: ModelSpec, seq_len: int, target_len: int = 0) -> Sample:
    """The sample of `spec`'s dummy data at `seq_len` (a sequence-to-sequence model's target at
    `target_len`, 0: as long); ModelError (one line) for a model whose input anatomy cannot
    make. Loads transformers (the head class): once per config."""
    return _sample(spec, json.dumps(spec.config, sort_keys=True, default=str), seq_len,
                   target_len if spec.task == SEQ2SEQ and target_len else seq_len)


@lru_cache(maxsize=32)
def _sample(spec: ModelSpec, config_key: str, seq_len: int, target_len: int) -> Sample:
    head = models.head_class(spec)
    config = models.head_config(head, models.transformers_config(spec))
    parameters = inspect.signature(head.forward).parameters
    models.check_inputs(spec)
    main = models.main_input(spec)
    low, high = models.token_range(spec)
    made: dict[str, Tensor] = {}
    if spec.task == IMAGE_CLASSIFICATION:
        words = _image(spec, config, main, parameters, made)
        made["labels"] = _class_labels(spec)
    elif spec.task == SEQ2SEQ:
        source, target = (_tokens(spec, part) for part in ("encoder", "decoder"))
        words = _source(spec, seq_len, main, made, source)
        codebooks = _codebooks(head, config, "decoder_input_ids")
        if codebooks:  # Dia's decoder: every codebook's ids per position, labels per codebook
            made["labels"] = Tensor((codebooks, target_len), TOKENS, tokens=target)
            made["decoder_input_ids"] = Tensor((target_len, codebooks), COPY, "labels",
                                               transpose=True)
            words += f", target {codebooks} codebooks × length {target_len}"
        else:
            made["labels"] = Tensor((target_len,), TOKENS, tokens=target)
            made["decoder_input_ids"] = Tensor((target_len,), SHIFTED, "labels")
            words += f", target length {target_len}"
    else:
        codebooks = _codebooks(head, config)
        if codebooks:
            made["input_ids"] = Tensor((codebooks, seq_len), TOKENS)
            words = f"{codebooks} codebooks × sequence length {seq_len}"
        else:
            made["input_ids"] = Tensor((seq_len,), TOKENS, last=_end_token(spec, config))
            words = f"sequence length {seq_len}"
        frames = _audio_in_step(spec, parameters)
        if frames is not None:
            made["input_features"] = Tensor((frames[0], frames[1] * seq_len), NOISE)
            words = f"audio features {frames[0]}×{frames[1] * seq_len} in step with {words}"
        if "pixel_values" in parameters and _prefixed_image(spec):
            side, channels = _vision_size(config)
            made["pixel_values"] = Tensor((channels, side, side), NOISE)
            words = f"images {side}×{side} and {words}"
        words += _text_alone(spec, made)
        if spec.task == TOKEN_CLASSIFICATION:  # transformers' loss: cross entropy per token
            made["labels"] = Tensor(made["input_ids"].shape, CLASS)
            words += f", one of {spec.num_labels} labels per token"
        else:
            made["labels"] = (Tensor((seq_len, codebooks), COPY, "input_ids", transpose=True)
                              if codebooks else Tensor((seq_len,), COPY, "input_ids")
                              if spec.task in (CAUSAL_LM, MASKED_LM) else _class_labels(spec))
    return Sample(tuple(made.items()), low, high, spec.num_labels, spec.decoder_start_token_id,
                  words)


def _end_token(spec: ModelSpec, config) -> int | None:
    """An encoder-decoder's sequence classifier (BART's, as facebook/bart-large-mnli; T5's) reads
    each sequence at its end-of-sequence token, which a tokenizer puts last and which it refuses
    to go without ("Each example must contain at least one <eos> token"): the config's end token
    there; None elsewhere."""
    end = getattr(config, "eos_token_id", None)
    if spec.task == SEQUENCE_CLASSIFICATION and getattr(config, "is_encoder_decoder", False) \
            and isinstance(end, int) and not isinstance(end, bool):
        return end
    return None


def _class_labels(spec: ModelSpec) -> Tensor:
    """A classifier's labels as its config's `problem_type` has its loss read them (transformers'
    sequence and image classifiers): a class each (cross-entropy); 0 or 1 for every label
    (multi-label: binary cross-entropy on floats of the logits' shape); a value for every label
    (regression: mean squared error on floats, one value where there is one label, as transformers
    takes a single label without a problem type)."""
    problem = spec.config.get("problem_type")
    if problem == "multi_label_classification":
        return Tensor((spec.num_labels,), MULTI_HOT)
    if problem == "regression" or (problem is None and spec.num_labels == 1):
        return Tensor(() if spec.num_labels == 1 else (spec.num_labels,), NOISE)
    return Tensor((), CLASS)


def _image(spec: ModelSpec, config, main: str, parameters, made: dict) -> str:
    """An image classifier's input: pixel values, patches with their grid, or pixel tokens."""
    if main == "input_ids" and "pixel_values" not in parameters:
        # The image as its pixels' cluster ids, one position each (ImageGPT): the whole image.
        length = next((spec.config[k] for k in models.POSITION_KEYS
                       if isinstance(spec.config.get(k), int)), None)
        if length is None:
            raise ModelError(f"model: {spec.display_name}: {spec.head} reads an image as tokens, "
                             "and the config names no length for them (n_positions)")
        made["input_ids"] = Tensor((length,), TOKENS)
        return f"images of {length} pixel tokens"
    size, channels = spec.image_size, spec.num_channels
    if "spatial_shapes" in parameters:  # patches and their grid (SigLIP 2's NaFlex)
        vision = getattr(config, "vision_config", config)
        patch, channels = vision.patch_size, getattr(vision, "num_channels", channels)
        side = size // patch
        most = getattr(vision, "num_patches", None)
        if isinstance(most, int) and side * side > most:
            side = math.isqrt(most)
        made["pixel_values"] = Tensor((side * side, channels * patch * patch), NOISE)
        made["pixel_attention_mask"] = Tensor((side * side,), ONES)
        made["spatial_shapes"] = Tensor((2,), VALUES, values=(side, side))
        return f"images {side * patch}×{side * patch} ({side}×{side} patches)"
    made["pixel_values"] = Tensor((channels, size, size), NOISE)
    return f"images {size}×{size}"


def _source(spec: ModelSpec, seq_len: int, main: str, made: dict,
            tokens: tuple[int, int] | None) -> str:
    """An encoder-decoder's encoder input: token ids, a raw waveform or log-mel features."""
    if main == "input_values":
        samples = seq_len * FRAME_SAMPLES
        made["input_values"] = Tensor((samples,), NOISE)
        return f"audio {samples:,} samples"
    if main == "input_features":
        features = spec.audio_features(seq_len)
        made["input_features"] = Tensor(features, NOISE)
        return f"audio features {features[0]}×{features[1]}"
    made["input_ids"] = Tensor((seq_len,), TOKENS, tokens=tokens)
    return f"source length {seq_len}"


def _tokens(spec: ModelSpec, part: str) -> tuple[int, int] | None:
    """The token range of an encoder-decoder's part where its config gives the part a vocabulary
    of its own (Dia's text encoder and audio decoder: `encoder_config`, `decoder_config`)."""
    config = spec.config.get(f"{part}_config")
    vocab = config.get("vocab_size") if isinstance(config, dict) else None
    return models.token_range(spec, vocab) if isinstance(vocab, int) else None


def _codebooks(head, config, name: str = "input_ids") -> int:
    """Codebooks per position where the forward takes each sample of `name` as one sequence per
    codebook (MusicGen's decoder: input ids of `(batch_size * num_codebooks, sequence_length)`,
    Dia's decoder inputs likewise, as their forward's own documentation gives the shape): the
    config's, or its decoder's (Dia calls them channels); 0 for one sequence."""
    documented = re.search(rf"^\s*{name} \((.*)$", head.forward.__doc__ or "", re.MULTILINE)
    if documented is None or "num_codebooks" not in documented[1]:
        return 0
    decoder = getattr(config, "decoder_config", None) or getattr(config, "decoder", None)
    for part, key in ((config, "num_codebooks"), (decoder, "num_codebooks"),
                      (decoder, "num_channels")):
        count = getattr(part, key, None)
        if isinstance(count, int) and not isinstance(count, bool):
            return count
    return 0


def _prefixed_image(spec: ModelSpec) -> bool:
    """An image the text follows with no token of its own in the text (GIT: the loss skips the
    image's positions, so the image must be there); a model with an image token trains on text
    alone."""
    return isinstance(spec.config.get("vision_config"), dict) and \
        not any("image_token" in key for key in spec.config)


# A forward's inputs that are no text (an image's pixels, a video's, audio features): a user's
# batch holding one the sample here does not make is not what the prediction traced.
MEDIA_INPUTS = ("pixel_values", "pixel_values_videos", "image_embeds", "input_features",
                "input_values", "audio_values")
# A tower's sub-config, what it takes in words, the tower in words, and its input.
_TOWER_INPUTS = (("vision_config", "image", "vision", "pixel_values"),
                 ("audio_config", "audio", "audio", "input_features"))


def _text_alone(spec: ModelSpec, made: dict) -> str:
    """Words for a decoder with a vision or audio tower that trains on text alone (LLaVA, Qwen2.5
    VL, Mistral 3, Qwen2-Audio: their image or audio is optional): the tower is in the weights, but
    no gradient reaches it, so it has no optimizer state either."""
    left = [(what, tower) for key, what, tower, tensor in _TOWER_INPUTS
            if isinstance(spec.config.get(key), dict) and tensor not in made]
    if not left:
        return ""
    inputs, towers = (" or ".join(part) for part in zip(*left))
    return f", text alone (no {inputs}: no gradient reaches its {towers} tower)"


def _audio_in_step(spec: ModelSpec, parameters) -> tuple[int, int] | None:
    """A decoder whose audio runs in step with its text (Voxtral Realtime adds each token's audio
    to its embedding, and needs it): the audio's mel bins and frames per token, as its config
    names them (audio_length_per_tok); None for a decoder that trains on text alone."""
    audio = spec.config.get("audio_config") or {}
    bins, per_token = audio.get("num_mel_bins"), spec.config.get("audio_length_per_tok")
    if "input_features" in parameters and isinstance(bins, int) and isinstance(per_token, int):
        return bins, per_token
    return None


def _vision_size(config) -> tuple[int, int]:
    vision = getattr(config, "vision_config", config)
    return vision.image_size, getattr(vision, "num_channels", 3)

"""The data a run trains on. The dummy dataset: the walkthrough's random data, shaped for the
model's task head as analysis/dummy_data.py lays a sample out (token ids in [100, 30000) within
the vocabulary, the walkthrough's labels 0 or 1 — a sequence's, or each token's —, random pixels,
waveforms or features). A user's dataset (`TextDataset`): its texts as analysis/data.py tokenized
them, padded by transformers' own collators. Items are made when asked for (numpy only: the
baseline phase loads no torch), the same for the same seed.
"""

from __future__ import annotations

import functools

import numpy as np

from anatomy.analysis import dummy_data
from anatomy.analysis.data import Tokenized
from anatomy.analysis.lengths import MAX_LENGTH
from anatomy.analysis.models import CAUSAL_LM, ModelSpec


class DummyDataset:
    """Map-style, as the Trainer's DataLoader takes it: `len()` and items by index, each a dict
    the default collator stacks into a batch."""

    def __init__(self, spec: ModelSpec, size: int, seq_len: int, seed: int, target_len: int = 0):
        self.spec, self.size, self.seq_len, self.seed = spec, size, seq_len, seed
        self.target_len = target_len  # a sequence-to-sequence model's (0: seq_len)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.size:
            raise IndexError(index)
        rng = np.random.default_rng((self.seed, index))
        item: dict = {}
        for name, tensor in self.sample.tensors:
            item[name] = _filled(tensor, self.sample, item, rng)
        return item

    @functools.cached_property
    def sample(self) -> dummy_data.Sample:
        """The layout every item fills: read once, not per item (its cache key is the config
        serialised, and the DataLoader asks for an item per sample of every step)."""
        return dummy_data.sample(self.spec, self.seq_len, self.target_len)

    def batch(self, size: int) -> dict:
        """The first `size` items as one batch of torch tensors (the profiler's)."""
        import torch

        items = [self[i] for i in range(min(size, self.size))]
        return {key: torch.as_tensor(np.stack([item[key] for item in items]))
                for key in items[0]}

    def collator(self):
        """None: the Trainer's default collator stacks the items (all of one length)."""
        return None


class TextDataset:
    """A dataset's texts, tokenized (analysis/data.py's token arrays, memory-mapped): map-style,
    each item what the tokenizer gave for one text — its token ids, a mask of ones, the other
    inputs the model takes — and a classifier's label laid out as the dummy data's (random, the
    same for the same seed: a label's value changes no memory). `collator()` pads a batch as
    transformers does: DataCollatorWithPadding, or for a causal LM DataCollatorForLanguageModeling
    (its labels the ids, -100 over the padding); to the longest text of each batch, or to
    max_length."""

    def __init__(self, spec: ModelSpec, tokenized: Tokenized, seed: int):
        self.spec, self.tokenized, self.seed = spec, tokenized, seed
        self.facts = tokenized.facts
        self.size = tokenized.lengths.texts

    def __len__(self) -> int:
        return self.size

    @functools.cached_property
    def _arrays(self) -> dict[str, np.ndarray]:
        folder = self.tokenized.folder
        names = ["offsets", "input_ids", *(n for n in self.facts.inputs or ()
                                           if n != "attention_mask")]
        return {name: np.load(f"{folder}/{name}.npy", mmap_mode="r") for name in names}

    @functools.cached_property
    def sample(self) -> dummy_data.Sample:
        return dummy_data.sample(self.spec, self.facts.max_length or 1)

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.size:
            raise IndexError(index)
        arrays = self._arrays
        start, end = int(arrays["offsets"][index]), int(arrays["offsets"][index + 1])
        item: dict = {"input_ids": arrays["input_ids"][start:end].tolist()}
        for name in self.facts.inputs or ():
            item[name] = [1] * (end - start) if name == "attention_mask" else \
                arrays[name][start:end].tolist()
        if self.spec.task != CAUSAL_LM:  # the collator makes a causal LM's from its ids
            rng = np.random.default_rng((self.seed, index))
            label = _filled(dict(self.sample.tensors)["labels"], self.sample, item, rng)
            item["labels"] = label.tolist() if isinstance(label, np.ndarray) else label
        return item

    def collator(self):
        from transformers import DataCollatorForLanguageModeling, DataCollatorWithPadding

        tokenizer = self.tokenized.tokenizer()
        to_max = self.facts.padding == MAX_LENGTH
        if self.spec.task == CAUSAL_LM:
            # Every text is at most max_length long: padded to a multiple of it, each batch is it.
            return DataCollatorForLanguageModeling(
                tokenizer, mlm=False, pad_to_multiple_of=self.facts.max_length if to_max else None)
        return DataCollatorWithPadding(tokenizer, padding=MAX_LENGTH if to_max else "longest",
                                       max_length=self.facts.max_length if to_max else None)

    def batch(self, size: int) -> dict:
        """The first `size` items as one padded batch of torch tensors (the profiler's)."""
        return dict(self.collator()([self[i] for i in range(min(size, self.size))]))


def _filled(tensor: dummy_data.Tensor, sample: dummy_data.Sample, made: dict, rng):
    """One sample's tensor, as numpy (the collator stacks them into the batch)."""
    if tensor.fill == dummy_data.TOKENS:
        low, high = tensor.tokens or (sample.low, sample.high)
        ids = rng.integers(low, high, tensor.shape, dtype=np.int64)
        if tensor.last is not None:
            ids[..., -1] = tensor.last
        return ids
    if tensor.fill == dummy_data.NOISE:
        return rng.standard_normal(tensor.shape, dtype=np.float32)
    if tensor.fill == dummy_data.ONES:
        return np.ones(tensor.shape, dtype=np.int64)
    if tensor.fill == dummy_data.VALUES:
        return np.array(tensor.values, dtype=np.int64)
    if tensor.fill == dummy_data.CLASS:  # a sequence's label, or a token classifier's per token
        return rng.integers(0, sample.num_labels, tensor.shape, dtype=np.int64) if tensor.shape \
            else int(rng.integers(0, sample.num_labels))
    if tensor.fill == dummy_data.MULTI_HOT:
        return rng.integers(0, 2, tensor.shape).astype(np.float32)
    source = made[tensor.source]
    if tensor.fill == dummy_data.COPY:
        return source.T.copy() if tensor.transpose else source.copy()
    return np.concatenate([[sample.start_token], source[:-1]]).astype(np.int64)  # SHIFTED

"""The dummy dataset a run trains on: the walkthrough's random data, shaped for the model's task
head as analysis/dummy_data.py lays a sample out (token ids in [100, 30000) within the
vocabulary, the walkthrough's labels 0 or 1 — a sequence's, or each token's —, random pixels,
waveforms or features). Items are made when asked for (numpy only: the baseline phase loads no
torch), the same for the same seed.
"""

from __future__ import annotations

import functools

import numpy as np

from anatomy.analysis import dummy_data
from anatomy.analysis.models import ModelSpec


class DummyDataset:
    """Map-style, as the Trainer's DataLoader takes it: `len()` and items by index, each a dict
    the default collator stacks into a batch."""

    def __init__(self, spec: ModelSpec, size: int, seq_len: int, seed: int):
        self.spec, self.size, self.seq_len, self.seed = spec, size, seq_len, seed

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
        return dummy_data.sample(self.spec, self.seq_len)

    def batch(self, size: int) -> dict:
        """The first `size` items as one batch of torch tensors (the profiler's)."""
        import torch

        items = [self[i] for i in range(min(size, self.size))]
        return {key: torch.as_tensor(np.stack([item[key] for item in items]))
                for key in items[0]}


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

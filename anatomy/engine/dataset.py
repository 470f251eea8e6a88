"""The dummy dataset a run trains on: the walkthrough's random data, shaped for the model's task
head. Items are made when asked for (numpy only: the baseline phase loads no torch), the same
for the same seed.

- sequence classification: token ids in [100, 30000) (within the vocabulary), a label 0 or 1
  (the walkthrough's);
- causal language modelling: token ids, and labels that are the same ids (the model shifts them);
- sequence to sequence: token ids (a speech encoder's: Whisper-style log-mel features), labels of
  the same length, and the decoder's inputs: the labels shifted right behind the start token, as
  DataCollatorForSeq2Seq makes them;
- image classification: random pixel values of the config's image size and channels, a label
  below the config's number of labels.
"""

from __future__ import annotations

import numpy as np

from anatomy.analysis.models import CAUSAL_LM, IMAGE_CLASSIFICATION, SEQ2SEQ, ModelSpec, token_range


class DummyDataset:
    """Map-style, as the Trainer's DataLoader takes it: `len()` and items by index, each a dict
    the default collator stacks into a batch."""

    def __init__(self, spec: ModelSpec, size: int, seq_len: int, seed: int):
        self.spec, self.size, self.seq_len, self.seed = spec, size, seq_len, seed
        self.task = spec.task

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.size:
            raise IndexError(index)
        rng = np.random.default_rng((self.seed, index))
        spec = self.spec
        if self.task == IMAGE_CLASSIFICATION:
            shape = (spec.num_channels, spec.image_size, spec.image_size)
            return {"pixel_values": rng.standard_normal(shape, dtype=np.float32),
                    "labels": int(rng.integers(0, spec.num_labels))}
        low, high = token_range(spec)
        if self.task == SEQ2SEQ:
            features = spec.audio_features(self.seq_len)
            inputs = ({"input_features": rng.standard_normal(features, dtype=np.float32)}
                      if features else
                      {"input_ids": rng.integers(low, high, (self.seq_len,), dtype=np.int64)})
            labels = rng.integers(low, high, (self.seq_len,), dtype=np.int64)
            decoder = np.concatenate([[spec.decoder_start_token_id], labels[:-1]]).astype(np.int64)
            return {**inputs, "decoder_input_ids": decoder, "labels": labels}
        ids = rng.integers(low, high, (self.seq_len,), dtype=np.int64)
        if self.task == CAUSAL_LM:
            return {"input_ids": ids, "labels": ids.copy()}
        return {"input_ids": ids, "labels": int(rng.integers(0, spec.num_labels))}

    def batch(self, size: int) -> dict:
        """The first `size` items as one batch of torch tensors (the profiler's)."""
        import torch

        items = [self[i] for i in range(min(size, self.size))]
        return {key: torch.as_tensor(np.stack([item[key] for item in items]))
                for key in items[0]}

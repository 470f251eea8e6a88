"""A dataset of texts for the screenshots, made as users make one: 2,000 short reviews of
lengths that spread as real ones do (log-normal, a few long ones), saved with `save_to_disk`, and
a word-level fast tokenizer saved with `save_pretrained`."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = ("the", "a", "film", "book", "was", "is", "not", "very", "good", "bad", "and", "but",
         "plot", "story", "actors", "slow", "long", "great", "boring", "ending", "i", "liked",
         "it", "too", "much", "of", "an", "hour", "characters", "music")
TEXTS = 2000


def build(folder: Path) -> tuple[Path, Path]:
    """(the dataset's folder, the tokenizer's folder), made under `folder`."""
    import datasets
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    model = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=model, pad_token="[PAD]",
                            unk_token="[UNK]").save_pretrained(folder / "tokenizer")
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(max(3, min(120, int(
        rng.lognormvariate(3.3, 0.55)))))) for _ in range(TEXTS)]
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(folder / "reviews"))
    return folder / "reviews", folder / "tokenizer"

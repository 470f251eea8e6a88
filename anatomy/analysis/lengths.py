"""A dataset's token lengths: their distribution (as a run stores it), and the batches the data
and the collator can form from them.

With dynamic padding (DataCollatorWithPadding's "longest") a batch is as long as its longest
sequence, so a run's peak is its longest batch's, not a typical one's. The Trainer shuffles (a new
order every epoch), so any batch may hold the data's longest sequence: the batch to plan for is
the B longest sequences, padded to the longest (`longest_batches`: the longest that can be formed,
and the one of the most tokens, for a model that skips the padding; beside it, where it holds no
padding, the same with padding). Padded to max_length, every batch is that long. The typical
batch (`typical_batch`) is the median over a shuffled epoch's batches of their padded length.

Pure Python: the prediction (prediction/batches.py), the CLI, the form and a stored run read it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

LONGEST = "longest"  # padding: each batch to its longest sequence (DataCollatorWithPadding)
MAX_LENGTH = "max_length"  # padding: every batch to max_length
PADDINGS = (LONGEST, MAX_LENGTH)
# The quantiles `predict` prints and the form shows, by name.
QUANTILES = {"min": 0.0, "10%": 0.1, "median": 0.5, "90%": 0.9, "99%": 0.99, "max": 1.0}
HISTOGRAM_BINS = 16  # bars whose labels a form column holds side by side


class TextBatch(NamedTuple):
    """A micro-batch of texts as the collator hands it to the model: each sequence's tokens before
    padding (longest first), the length they are padded to, the tensors the tokenizer gives besides
    the token ids (attention_mask, token_type_ids) and the side the padding goes on."""

    lengths: tuple[int, ...]
    padded_to: int
    inputs: tuple[str, ...] = ("attention_mask",)
    padding_side: str = "right"

    @property
    def size(self) -> int:
        return len(self.lengths)

    def words(self) -> str:
        return f"{self.size} × {self.padded_to:,} tokens"


@dataclass(frozen=True)
class Lengths:
    """How many texts have each length in tokens (after truncation), shortest first."""

    counts: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, lengths: Iterable[int]) -> Lengths:
        return cls(tuple(sorted(Counter(int(n) for n in lengths).items())))

    @property
    def texts(self) -> int:
        return sum(count for _, count in self.counts)

    @property
    def tokens(self) -> int:
        return sum(length * count for length, count in self.counts)

    @property
    def longest(self) -> int:
        return self.counts[-1][0] if self.counts else 0

    def at_most(self, length: int) -> int:
        """Texts of at most `length` tokens."""
        return sum(count for n, count in self.counts if n <= length)

    def quantile(self, q: float) -> int:
        """The shortest length that at least a share `q` of the texts do not exceed (0: the
        shortest text's, 1: the longest's)."""
        if not self.counts:
            return 0
        wanted = max(1, math.ceil(q * self.texts))
        seen = 0
        for length, count in self.counts:
            seen += count
            if seen >= wanted:
                return length
        return self.longest

    def quantiles(self) -> dict[str, int]:
        return {name: self.quantile(q) for name, q in QUANTILES.items()}

    def top(self, n: int) -> tuple[int, ...]:
        """The `n` longest lengths, longest first."""
        out: list[int] = []
        for length, count in reversed(self.counts):
            out += [length] * min(count, n - len(out))
            if len(out) == n:
                break
        return tuple(out)

    def median_batch_longest(self, batch_size: int) -> int:
        """The median, over the batches of a shuffled epoch, of a batch's longest sequence: the
        shortest length L such that a batch of `batch_size` texts drawn at random (without
        replacement) holds none longer than L at least half the time — C(k, B) / C(N, B), k the
        texts of at most L tokens."""
        total, size = self.texts, min(batch_size, self.texts)
        seen = 0
        for length, count in self.counts:
            seen += count
            if _none_longer(seen, total, size) >= 0.5:
                return length
        return self.longest

    def histogram(self, bins: int = HISTOGRAM_BINS) -> list[tuple[int, int, int]]:
        """(first length, last length, texts) of up to `bins` bins of equal width, the shortest
        length to the longest."""
        if not self.counts:
            return []
        low, high = self.counts[0][0], self.longest
        width = max(1, math.ceil((high - low + 1) / bins))
        out: dict[int, int] = {}
        for length, count in self.counts:
            start = low + (length - low) // width * width
            out[start] = out.get(start, 0) + count
        return [(start, start + width - 1, count) for start, count in sorted(out.items())]

    def words(self) -> str:
        """The distribution in a line: the texts, their tokens and the quantiles."""
        quantiles = ", ".join(f"{name} {value:,}" for name, value in self.quantiles().items())
        return f"{self.texts:,} texts, {self.tokens:,} tokens; tokens per text: {quantiles}"


def _none_longer(shorter: int, total: int, size: int) -> float:
    """The chance that `size` texts drawn without replacement from `total` all come from the
    `shorter` ones."""
    if shorter < size:
        return 0.0
    chance = 1.0
    for i in range(size):
        chance *= (shorter - i) / (total - i)
    return chance


def longest_batches(lengths: Lengths, batch_size: int, padding: str, max_length: int,
                    inputs: tuple[str, ...] = ("attention_mask",), padding_side: str = "right"
                    ) -> tuple[TextBatch, ...]:
    """The batches that may be the data's worst, padded to the longest text (or to `max_length`
    with that padding): its `batch_size` longest texts (the most tokens); and where those are all
    as long as the batch, so that it holds no padding, those but the last beside the longest
    text shorter than them (a batch with padding: a model then holds its attention mask, which
    one without skips). The prediction takes the larger."""
    top = lengths.top(batch_size)
    padded_to = max_length if padding == MAX_LENGTH else (top[0] if top else 0)
    found = [TextBatch(top, padded_to, inputs, padding_side)]
    shorter = [length for length, _ in lengths.counts if length < padded_to]
    if top and top[-1] == padded_to and shorter and len(top) > 1:
        found.append(TextBatch((*top[:-1], shorter[-1]), padded_to, inputs, padding_side))
    return tuple(found)


def typical_batch(lengths: Lengths, batch_size: int, padding: str, max_length: int,
                  inputs: tuple[str, ...] = ("attention_mask",), padding_side: str = "right"
                  ) -> TextBatch:
    """A typical batch: its longest sequence the median batch's longest (`median_batch_longest`),
    the others the data's median text, no longer than it; padded to the longest, or to
    `max_length` with that padding."""
    size = min(batch_size, lengths.texts)
    longest = lengths.median_batch_longest(size)
    others = min(lengths.quantile(0.5), longest)
    padded_to = max_length if padding == MAX_LENGTH else longest
    return TextBatch((longest, *[others] * (size - 1)), padded_to, inputs, padding_side)

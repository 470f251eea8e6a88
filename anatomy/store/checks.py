"""What a stored value must be, checked where a typed record is built from JSON: each check gives
the value back (converted where a type says so) or refuses it in one line that names where it
is and what it should be (`runs[0].run.environment.world_size: must be a whole number from 1 to
65535, got 'two'`).

The import builds every record through these (analysis/transfer.py), so a value of the wrong type
never reaches a reader; the store reads what it wrote itself leniently (facts.py).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Callable
from enum import Enum
from typing import Any

MAX_MEMORY = 2**50  # a pebibyte: far above any device, so a larger figure is a broken file
MAX_INTEGER = 2**63 - 1  # SQLite's INTEGER
MAX_SECONDS = 1e9  # since the run's start: three decades
MAX_EPOCH = 1e11  # wall clock, seconds since 1970: the year 5138
MAX_RANK = 65_535
MAX_GPUS = 64  # the most GPUs a machine may have (the options' GPU index goes to 63)

Check = Callable[[Any, str], Any]


class InvalidValue(ValueError):
    """A value that is not what its place holds: `where` (a path into the JSON) and `what`."""

    def __init__(self, where: str, what: str):
        super().__init__(f"{where}: {what}")
        self.where, self.what = where, what


class Unreadable:
    """A JSON number that is no finite float (1e400, NaN, Infinity): kept as written, so the
    message quotes the file and no value check ever passes it."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def shown(value: Any) -> str:
    """A value as a message quotes it: on one line, and short (an integer of thousands of digits
    cannot even be written out in full)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"an integer of {len(str(abs(value)))} digits" if abs(value) < 10**4000 else \
            "an integer of thousands of digits"
    text = repr(value.value if isinstance(value, Enum) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def digits(word: str, high: int = MAX_INTEGER) -> int | None:
    """A whole number as a person or a launcher writes one ("7", "007") up to `high`: ASCII
    digits alone, or None. str.isdigit() alone lets through "²", which int() refuses, and "٣",
    which int() reads as 3: every index, id, port and rank typed or set in the environment is
    read here. Thousands of digits are refused before int(), which raises on them."""
    if not (word.isascii() and word.isdigit()):
        return None
    significant = word.lstrip("0") or "0"
    if len(significant) > len(str(high)) or int(significant) > high:
        return None
    return int(significant)


def is_tag(value: Any) -> bool:
    """A run's tag: text, not blank, without a comma (the column is comma-separated)."""
    return isinstance(value, str) and bool(value.strip()) and "," not in value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # a whole number beyond every float (10**400)
        return False


def whole(value: Any, where: str, low: int = 0, high: int = MAX_INTEGER,
          optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if not is_int(value) or not low <= value <= high:
        raise InvalidValue(where, f"must be a whole number from {low} to {high}, got "
                           + shown(value))
    return value


def count(value: Any, where: str) -> int | None:
    """A whole number from 0, or None."""
    return whole(value, where, optional=True)


def memory(value: Any, where: str, optional: bool = True) -> int | None:
    if value is None and optional:
        return None
    if not is_int(value) or not 0 <= value <= MAX_MEMORY:
        raise InvalidValue(where, "memory must be a whole number of bytes from 0 to 2**50, got "
                           + shown(value))
    return value


def seconds(value: Any, where: str, high: float = MAX_SECONDS, optional: bool = False
            ) -> float | None:
    if value is None and optional:
        return None
    if not is_number(value) or not 0 <= value <= high:
        raise InvalidValue(where, f"time must be a finite number of seconds from 0 to {high:,.0f},"
                           " got " + shown(value))
    return value


def encodable(text: str, where: str) -> str:
    """Text SQLite can store: UTF-8, which a lone surrogate ("\\ud800" in JSON) is not."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        char = text[error.start]
        if "\udc80" <= char <= "\udcff":  # a byte Python could not decode (a file name's)
            raise InvalidValue(where, f"holds the byte 0x{ord(char) - 0xDC00:02x}, which is not "
                               "UTF-8 text") from None
        raise InvalidValue(where, f"holds {char!r}, half of a UTF-16 pair, which is "
                           "not text that can be stored") from None
    return text


def one_line(value: str, where: str) -> str:
    """A name or a tag: one line of printable text. A control character (a newline, a tab, a
    terminal's escape) would break the line that lists it, or colour and move what a terminal
    shows after it."""
    bad = next((c for c in value if unicodedata.category(c) == "Cc" or c in "\u2028\u2029"),
               None)
    if bad is not None:
        raise InvalidValue(where, f"holds the control character {bad!r}: give one line of "
                           "printable text")
    return encodable(value, where)


def text(value: Any, where: str, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidValue(where, f"must be text, got {shown(value)}")
    return encodable(value, where)


def number(value: Any, where: str, optional: bool = True) -> float | None:
    """A finite number from 0 (a time, a rate; a loss is not bounded below: `finite`)."""
    if value is None and optional:
        return None
    if not is_number(value) or value < 0:
        raise InvalidValue(where, f"must be a finite number from 0, got {shown(value)}")
    return value


def finite(value: Any, where: str) -> float | None:
    """Any finite number, or None."""
    if value is not None and not is_number(value):
        raise InvalidValue(where, f"must be a finite number, got {shown(value)}")
    if isinstance(value, int) and not -2**63 <= value < 2**63:
        return float(value)  # as SQLite's REAL keeps it: its INTEGER stops at 2**63
    return value


def loss(value: Any, where: str) -> float | None:
    """A loss: any finite number, or None. A NaN or an infinity (a training that diverged) is
    None, as SQLite keeps a step's NaN loss: refusing it failed the run (and raised in the
    user's own Trainer, from the callback's on_train_end) after the training had ended."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return finite(value, where)


def flag(value: Any, where: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise InvalidValue(where, f"must be true or false, got {shown(value)}")
    return value


def choice(value: Any, where: str, choices: tuple, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if value not in choices:
        raise InvalidValue(where, f"{shown(value)} is not one of {', '.join(map(str, choices))}")
    return value


def member(kind: type[Enum]) -> Check:
    """A check that gives one of the enum `kind`'s members (None stays None)."""
    def check(value: Any, where: str) -> Enum | None:
        if value is None:
            return None
        if not isinstance(value, str) or value not in kind._value2member_map_:
            raise InvalidValue(where, f"{shown(value)} is not one of "
                               + ", ".join(m.value for m in kind))
        return kind(value)
    return check


def obj(value: Any, where: str, required: tuple[str, ...] = ()) -> dict:
    if not isinstance(value, dict):
        raise InvalidValue(where, f"must be a JSON object, got {type(value).__name__} "
                           + shown(value))
    missing = [key for key in required if key not in value]
    if missing:
        raise InvalidValue(where, f"is missing {', '.join(repr(k) for k in missing)}")
    return value


def array(value: Any, where: str) -> list | tuple:
    if not isinstance(value, (list, tuple)):
        raise InvalidValue(where, f"must be a JSON array, got {type(value).__name__} "
                           + shown(value))
    return value


def wholes(low: int = 0, high: int = MAX_INTEGER) -> Check:
    """A check that gives a list of whole numbers as a tuple (None stays None)."""
    def check(value: Any, where: str) -> tuple[int, ...] | None:
        if value is None:
            return None
        return tuple(whole(item, f"{where}[{i}]", low, high)
                     for i, item in enumerate(array(value, where)))
    return check


def plain(value: Any, where: str) -> Any:
    """Free-form JSON (a key a newer anatomy stored, a model's config): any shape, but only
    numbers SQLite and JSON keep."""
    if isinstance(value, dict):
        for key, item in value.items():
            encodable(key, f"{where} (a key)")
            plain(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            plain(item, f"{where}[{index}]")
    elif is_int(value):
        whole(value, where, -MAX_INTEGER - 1)
    elif isinstance(value, (float, Unreadable)):
        if not is_number(value):
            raise InvalidValue(where, f"must be a finite number, got {shown(value)}")
    elif isinstance(value, str):
        encodable(value, where)
    elif not (value is None or isinstance(value, bool)):
        raise InvalidValue(where, f"is not JSON: {shown(value)}")
    return value


def plain_object(value: Any, where: str) -> dict | None:
    """A free-form JSON object, or None."""
    return None if value is None else plain(obj(value, where), where)

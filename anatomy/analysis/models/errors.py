"""A model that cannot be used, in one line (`ModelError`), and an error from transformers' code as
one line that says where it stopped.
"""

from __future__ import annotations


class ModelError(ValueError):
    """A model that cannot be used, in one line naming what is wrong."""


def first_line(error: BaseException) -> str:
    """An exception as one line: its first line (with the next where the first only announces
    it, "Validation error for field 'x':"), or its type where it has no words."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    for line in lines[1:]:
        if not text.endswith(":"):
            break
        text += " " + line
    return (text if len(text) <= 300 else text[:297] + "...") or type(error).__name__


def where_it_stopped(error: BaseException) -> str:
    """The model's own code where an error stopped it ("modeling_x.py, XAttention.forward: "): the
    part a trace could not follow, the layer its config could not make; empty when it stopped
    elsewhere (in torch, in anatomy)."""
    found = ""
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if "/transformers/models/" in code.co_filename.replace("\\", "/"):
            found = (f"{code.co_filename.replace(chr(92), '/').rsplit('/', 1)[-1]}, "
                     f"{getattr(code, 'co_qualname', code.co_name)}: ")
        tb = tb.tb_next
    return found


def cannot_build(model: str, error: BaseException) -> ModelError:
    """transformers' own code refusing to build a model (a library its head needs and this
    machine lacks, a config its layers cannot take), as the run and its check before the run
    say it."""
    return ModelError(f"model: {model}: transformers cannot build it: "
                      f"{where_it_stopped(error)}{first_line(error)}")

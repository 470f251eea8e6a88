"""How several training processes share the work: a module per strategy (ddp.py, fsdp.py), each a
`Strategy` (base.py), and the registry every reader asks for one by its name.

A strategy says what the Trainer is given for it, what it refuses (one line each), what one rank
of it holds — worked out from one process's prediction, or traced where arithmetic cannot follow
it — and the words the pages and messages use for it. Nothing else in anatomy branches on a
strategy's name: a new one is a module here, its entry in `REGISTERED`, and, where a rank's step
must be traced, a tracer module of prediction/tracing/ that its `tracer` names.

It sits just above the vocabulary (the store checks a stored run's strategy against the
registry) and imports nothing else of anatomy; torch and transformers only inside the functions
that need them.
"""

from __future__ import annotations

from anatomy.strategies import ddp, fsdp
from anatomy.strategies.base import RankMemory, Strategy, TracedRank

__all__ = ["DEFAULT", "REGISTERED", "RankMemory", "Strategy", "TracedRank", "UnknownStrategy",
           "buffer_names", "described", "named", "names", "register"]

# In the order the option lists them.
REGISTERED: list[Strategy] = [ddp.STRATEGY, fsdp.STRATEGY]
# The Trainer's own way, which a launch that says nothing trains with: the option's default.
DEFAULT = ddp.STRATEGY.name


class UnknownStrategy(ValueError):
    """A name no registered strategy goes by, in one line."""


def names() -> tuple[str, ...]:
    """Every registered strategy's name, as the option offers them."""
    return tuple(strategy.name for strategy in REGISTERED)


def named(name: str) -> Strategy:
    """The strategy `name` names; UnknownStrategy where none does."""
    for strategy in REGISTERED:
        if strategy.name == name:
            return strategy
    raise UnknownStrategy(f"{name!r} is not one of {', '.join(names())}")


def register(strategy: Strategy) -> None:
    """Offers one more strategy (a module's entry in REGISTERED does it as anatomy loads)."""
    if strategy.name in names():
        raise ValueError(f"a strategy named {strategy.name!r} is registered already")
    REGISTERED.append(strategy)


def described() -> str:
    """Each strategy by its name and what it does, as the option's help lists them: "ddp (each
    holds the whole model) or fsdp (…)"."""
    words = [f"{strategy.name} ({strategy.summary})" for strategy in REGISTERED]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def buffer_names() -> tuple[str, ...]:
    """Every strategy's buffers as a rank's prediction lists them (0 where another strategy's):
    `predict --json` has the same keys whichever strategy a run uses."""
    return tuple(name for strategy in REGISTERED for name in strategy.buffers)

"""What fake tensors do not know: the values some operators read to decide what they make.

A traced step runs on fake tensors, which have shapes and no values. A few operators of a training
step read values all the same: `nonzero` and boolean indexing (how many labels are set), `unique`
(how many sequences end where), `.item()` and `if tensor:` (is the padding mask all ones?). On the
data's own tensors (token ids, labels, positions, masks: small, and made from the batch and from
constants) those answers are the real run's, so the trace keeps their values beside them:
`DataValues` runs each operator whose inputs all have values a second time on those values (CPU,
real, small), and answers a value-reading operator from them. A tensor made from the weights has
no values (it is as large as the model's activations); an operator that reads one is refused by
name (`UnknownValues`).

One choice made from the weights is answered all the same: a mixture of experts' router, which
picks each token's experts (`topk`, `argmax` of its scores) and then reads how many tokens each
expert got (`tolist`, `nonzero`, `.item()`). Random weights route tokens as they fall; the trace
routes them evenly (`balanced_choice`): token t takes experts t·k … t·k + k - 1 (mod the experts).
Each expert's tensors are as large as its share of the tokens, so their bytes add up to the same
total however the tokens fall, as long as every expert takes some (with batches of dozens of
tokens and a handful of experts, every expert does) and the experts are alike. Where they are
not (LongCat-Flash's zero-compute experts, identities beside experts that compute), the run's
figure moves with how its random weights route, and the even split is its expected value: a
LongCat-Flash run's activations move by the bytes an expert that computes saves beyond an
identity, for each choice routed one way rather than the other (docs/COVERAGE.md).

transformers itself skips its value-reading checks on fake tensors ("tracing") and takes a more
general path than the real run: `real_paths()` has it take the real run's path, since here the
values are known.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
)
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.weak import WeakIdKeyDictionary

# Tensors of more elements carry no values: data tensors are batch × sequence (a mask: × sequence
# again), and beyond this the values would cost the memory the fake tensors save.
VALUE_LIMIT = 1 << 22


class UnknownValues(RuntimeError):
    """An operator read values the trace does not have (of a tensor made from the weights)."""


def _mutated(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors an operator writes into."""
    out = []
    schema = func._schema
    for index, argument in enumerate(schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[index] if index < len(args) else kwargs.get(argument.name)
        out.extend(t for t in tree_leaves(value) if isinstance(t, torch.Tensor))
    return out


aten = torch.ops.aten
# Operators that choose among a dimension's entries and return the indices chosen: (the output
# holding the indices, whether the chosen dimension stays in it).
CHOICES = {aten.topk.default: (1, True), aten.argmax.default: (0, False),
           aten.max.dim: (1, False)}
# Operators that pick elements by index tensors (a boolean mask among them): `_masked`.
MASKED = (aten.index.Tensor, aten.index_put.default, aten.index_put_.default)


def balanced_choice(func, args, kwargs, indices: torch.Tensor) -> torch.Tensor:
    """The indices a choice among `args[0]`'s entries returns, spread evenly: the r-th choice
    (counting over every row) takes entry r mod the dimension's size, so the rows' choices are
    distinct within a row and every entry is chosen as often as any other."""
    source = args[0]
    if func is aten.topk.default:
        dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
    else:
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
    dim = 0 if dim is None else dim % max(source.dim(), 1)
    size = source.shape[dim] if source.dim() else 1
    keeps = CHOICES[func][1]
    moved = list(indices.shape)
    if keeps:
        moved.append(moved.pop(dim))
    with _disable_current_modes():
        values = (torch.arange(indices.numel()) % max(size, 1)).reshape(moved)
        if keeps and indices.dim():
            values = values.movedim(-1, dim)
        return values.to(indices.dtype).contiguous()


class DataValues(TorchDispatchMode):
    """Keeps the values of small tensors whose inputs all have values (or that are made from
    nothing: arange, ones, randint), and answers value-reading operators from them."""

    def __init__(self):
        super().__init__()
        self.values: WeakIdKeyDictionary = WeakIdKeyDictionary()  # fake tensor -> real tensor
        self.beyond = 0  # the most elements of a result left without values for its size

    def __enter__(self):
        # A one-element tensor in an f-string is its value (`f"expert_{index[0]}"`, Switch
        # Transformers' experts by name); a fake one formats as its repr: its value, where known.
        values = self.values

        def format_value(tensor, spec):
            real = values.get(tensor) if tensor.dim() == 0 else None
            if real is None:
                return torch.Tensor.__format__(tensor, spec)
            with _disable_current_modes():
                return real.item().__format__(spec)

        FakeTensor.__format__ = format_value
        return super().__enter__()

    def __exit__(self, *exc):
        del FakeTensor.__format__
        return super().__exit__(*exc)

    def _real(self, value):
        """A fake tensor's values; a real tensor (a constant the model wrote, such as the
        indices of `x[:, [-1, 0]]`) is its own."""
        if isinstance(value, FakeTensor):
            return self.values[value]
        return value

    def _known(self, args, kwargs) -> bool:
        """Every tensor input has values: a fake one kept beside it, a plain real one its own. A
        wrapper (FSDP's DTensor around a fake shard) has none: run again, its outputs would
        hold the fake storages it wraps, and the trace would see them freed late."""
        for tensor in tree_leaves((args, kwargs)):
            if not isinstance(tensor, torch.Tensor):
                continue
            if isinstance(tensor, FakeTensor):
                if self.values.get(tensor) is None:
                    return False
            elif type(tensor) not in (torch.Tensor, torch.nn.Parameter):
                return False
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            out = func(*args, **kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException):
            return self._answer(func, args, kwargs)
        if not self._known(args, kwargs):
            for tensor in _mutated(func, args, kwargs):  # its values are no longer known
                self.values.pop(tensor, None)
            if func in CHOICES:  # a router's choice, made from the weights
                indices = out[CHOICES[func][0]] if isinstance(out, (tuple, list)) else out
                if isinstance(indices, FakeTensor) and indices.numel() <= VALUE_LIMIT:
                    self.values[indices] = balanced_choice(func, args, kwargs, indices)
            return out
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        elements = sum(t.numel() for t in outputs)
        if outputs and elements <= VALUE_LIMIT:
            self._follow(func, args, kwargs, outputs)
        else:
            self.beyond = max(self.beyond, elements)
        return out

    def _masked(self, func, args, kwargs):
        """`x[mask]` (and `x[mask] = y`) of a tensor made from the weights, by a mask with values
        (X-MOD's adapters pick each language's tokens by the batch's own language ids): which
        elements it takes follows from the mask alone, so the mask's positions as index
        tensors (what the kernel turns a boolean mask into) take the same elements, in shapes
        fake tensors know."""
        indices = []
        for index in args[1]:
            if index is None or index.dtype not in (torch.bool, torch.uint8):
                indices.append(index)
                continue
            with _disable_current_modes():
                positions = self._real(index).nonzero().unbind(1)
            for position in positions:
                made = torch.empty_strided(position.shape, position.stride(),
                                           dtype=position.dtype, device=index.device)
                self.values[made] = position
                indices.append(made)
        return func(args[0], indices, *args[2:], **kwargs)

    def _run(self, func, args, kwargs):
        with _disable_current_modes():
            return func(*tree_map(self._real, args), **tree_map(self._real, kwargs))

    def _follow(self, func, args, kwargs, outputs) -> None:
        try:
            real = self._run(func, args, kwargs)
        except Exception:  # noqa: BLE001 - an operator without a CPU kernel: no values, no harm
            for tensor in outputs:
                self.values.pop(tensor, None)
            return
        reals = [t for t in tree_leaves(real) if isinstance(t, torch.Tensor)]
        if len(reals) == len(outputs):
            for fake, value in zip(outputs, reals):
                self.values[fake] = value

    def _answer(self, func, args, kwargs):
        if not self._known(args, kwargs):
            if func in MASKED and self._known(args[1], {}):
                return self._masked(func, args, kwargs)
            if self.beyond:  # a data tensor too large to follow: the batch's size, not the model
                raise UnknownValues(
                    f"{func.__name__} reads the values of a tensor of {self.beyond:,} elements, "
                    f"more than the prediction follows ({VALUE_LIMIT:,}): a smaller batch size "
                    "× sequence length predicts")
            raise UnknownValues(
                f"{func.__name__} reads the values of a tensor made from the weights")
        real = self._run(func, args, kwargs)
        device = next(t.device for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))

        def fake(value):
            if not isinstance(value, torch.Tensor):
                return value
            made = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                       device=device)
            self.values[made] = value
            return made

        return tree_map(fake, real)


@contextmanager
def real_paths():
    """transformers' own checks that read values (is the padding mask all ones? are sequences
    packed?) run on fake tensors as on real ones: the trace has the values (`DataValues`), and
    the real run takes the path they decide."""
    from transformers.utils import import_utils

    saved = import_utils.is_fake_tensor
    import_utils.is_fake_tensor = lambda tensor: False
    try:
        yield
    finally:
        import_utils.is_fake_tensor = saved

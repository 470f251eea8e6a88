"""What a trace on fake tensors answers where values decide: a router's choice made from the
weights (tracing/values.py), and the grouped matmul's shape for inputs the meta kernel refuses
(tracing/fake_kernels.py)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from anatomy.prediction.tracing.fake_kernels import FakeKernels
from anatomy.prediction.tracing.values import (
    VALUE_LIMIT,
    DataValues,
    UnknownValues,
    balanced_choice,
)

aten = torch.ops.aten


def test_a_balanced_choice_takes_distinct_entries_in_a_row_and_each_as_often():
    scores = torch.zeros(6, 10, 4)
    chosen = balanced_choice(aten.topk.default, (scores, 2), {}, torch.empty(6, 10, 2,
                                                                             dtype=torch.long))
    assert all(len(set(row.tolist())) == 2 for row in chosen.reshape(-1, 2))
    assert torch.bincount(chosen.flatten(), minlength=4).tolist() == [30, 30, 30, 30]
    along_rows = balanced_choice(aten.topk.default, (scores, 3, 1), {},
                                 torch.empty(6, 3, 4, dtype=torch.long))
    assert all(len(set(along_rows[b, :, c].tolist())) == 3 for b in range(6) for c in range(4))
    top = balanced_choice(aten.argmax.default, (scores, -1), {}, torch.empty(6, 10,
                                                                           dtype=torch.long))
    assert torch.bincount(top.flatten(), minlength=4).tolist() == [15, 15, 15, 15]


def test_a_router_made_from_the_weights_is_read_as_evenly_routed():
    """JetMoE's gating: top-k of a linear layer's scores, then how many tokens each expert got
    (`tolist`), then the tokens grouped by expert: a trace answers it, as for the real run's
    total of tokens over the experts."""
    experts, top_k, tokens = 4, 2, 12
    # the weights and the hidden states come from outside the trace, their values unknown (made
    # inside, torch.empty is a fake tensor of values, which from_tensor keeps since torch 2.14)
    weight, hidden = torch.empty(experts, 8), torch.empty(tokens, 8)
    with FakeTensorMode() as mode, DataValues():
        weight, hidden = mode.from_tensor(weight), mode.from_tensor(hidden)
        logits = hidden @ weight.T
        _, chosen = logits.topk(top_k, dim=1)
        gates = torch.zeros(tokens, experts).scatter(1, chosen, 1)
        sizes = gates.long().sum(0).tolist()
        _, order = chosen.flatten().sort(0)
        grouped = hidden[order.div(top_k, rounding_mode="trunc")].split(sizes)
        hit = (gates.sum(0) > 0).nonzero()
    assert sizes == [tokens * top_k // experts] * experts
    assert [g.shape[0] for g in grouped] == sizes and hit.shape == (experts, 1)


def test_the_grouped_matmul_of_fp32_rows_unaligned_for_cuda_has_its_shape():
    """fp32 rows of 44 elements: the CPU kernel takes them, the meta kernel (bf16 only, rows
    aligned to 16 bytes) does not; the trace gives the CPU kernel's shape."""
    real = torch._grouped_mm(torch.randn(12, 44), torch.randn(3, 44, 20),
                             offs=torch.tensor([4, 8, 12], dtype=torch.int32))
    with FakeTensorMode() as mode, FakeKernels():
        out = torch._grouped_mm(mode.from_tensor(torch.empty(12, 44)),
                                mode.from_tensor(torch.empty(3, 44, 20)),
                                offs=mode.from_tensor(torch.tensor([4, 8, 12],
                                                                   dtype=torch.int32)))
    assert out.shape == real.shape and out.dtype == torch.float32


def test_unfolded_patches_hold_the_storage_atens_kernel_gives_them():
    """MobileViT-v2's F.unfold of a 7×7 map into 2×2 patches: the CPU's kernel resizes an
    input-like tensor, which keeps the input's storage (autograd saves it); an output larger
    than the input has its own size."""
    for shape, kernel, stride in (((2, 8, 7, 7), 2, 2), ((2, 8, 8, 8), 3, 1)):
        real = torch.nn.functional.unfold(torch.randn(shape), kernel, stride=stride)
        with FakeTensorMode() as mode, FakeKernels():
            fake = torch.nn.functional.unfold(mode.from_tensor(torch.empty(shape)), kernel,
                                              stride=stride)
        assert (fake.shape, fake.stride()) == (real.shape, real.stride())
        assert fake.untyped_storage().nbytes() == real.untyped_storage().nbytes()


def test_a_module_converted_to_its_own_dtype_and_an_expert_named_by_a_tensor():
    """Switch Transformers' router converts its classifier to the dtype it has, in its forward,
    and its experts are named by a tensor in an f-string: both as the real run does them."""
    from anatomy.prediction.tracing.fake_kernels import self_swaps
    from anatomy.prediction.tracing.record import to_fake

    with torch.device("meta"):
        model = torch.nn.Linear(4, 4)
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    to_fake(model, mode)
    weight = model.weight
    with mode, self_swaps(), DataValues():
        model.to(torch.float32)
        index = torch.tensor([[3], [1]])[0]  # made from nothing: its values are known
        name = f"expert_{index[0]}"
    assert model.weight is weight and name == "expert_3"


def test_a_data_tensor_too_large_to_follow_is_named_as_the_batchs_size_not_the_weights():
    """`anatomy predict --model tinyllama-1.1b --batch-size 4096 --seq-len 2048` read "reads the
    values of a tensor made from the weights": Llama's mask check (`(mask[:, -1] == 0).all()`)
    on 8.4 M tokens, more than the trace keeps values for. The line says so, and what to do."""
    with FakeTensorMode(), DataValues():
        small = torch.ones(2, 64, dtype=torch.long)
        assert bool((small[:, -1] == 1).all())  # made from nothing, small: its values are known
        large = torch.ones(VALUE_LIMIT + 1, dtype=torch.long)
        with pytest.raises(UnknownValues, match=f"a tensor of {VALUE_LIMIT + 1:,} elements, "
                                                f"more than the prediction follows"):
            bool((large == 0).all())

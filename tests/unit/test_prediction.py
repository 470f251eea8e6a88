"""The traced prediction's parts that need no whole model traced: the optimizer the step makes,
the CUDA side's kernels, reductions and autograd's sums traced on a few fake tensors, and the
searches for the largest batch size. (Those that trace a model for seconds a case — the built
model's weights, LoRA, FSDP's shards, the batch sizes made linear, the convolutions, figures
measured on an H200 — are tests/e2e/test_prediction_traced.py; held against real tensors, the
same step on real CPU tensors for every tiny architecture and feature, and the largest batch
size's search held to each size's own trace: proofs of whole traces,
tests/e2e/test_prediction_exactness.py.)"""

from __future__ import annotations

import dataclasses
import json
from contextlib import nullcontext

import pytest
import torch

from anatomy.analysis import dummy_data, models
from anatomy.analysis.options import RunOptions
from anatomy.prediction import PredictionError, predict
from anatomy.prediction.device_constants import DEFAULT
from anatomy.prediction.tracing.trainer_step import make_optimizer, training_arguments
from anatomy.vocabulary import Optimizer


@pytest.mark.parametrize("optim", Optimizer.values())
@pytest.mark.parametrize(("name", "lora_rank"), [("tiny", 0), ("tiny-llama", 0), ("tiny-llama", 4)])
def test_the_optimizer_is_the_one_the_trainer_makes(name, lora_rank, optim):
    """The step makes its optimizer without transformers.trainer (too slow to import for a cold
    `predict`): the same class, arguments and parameter groups as the Trainer's own."""
    from transformers import Trainer

    model, _ = models.build_model(models.resolve(name), "cpu", lora_rank=lora_rank,
                                  pretrained=False)
    ours = make_optimizer(model, optim)
    theirs = Trainer(model=model, args=training_arguments(optim)).create_optimizer()
    assert type(ours) is type(theirs)
    assert ours.defaults == theirs.defaults
    assert [{**g, "params": [id(p) for p in g["params"]]} for g in ours.param_groups] == \
        [{**g, "params": [id(p) for p in g["params"]]} for g in theirs.param_groups]
    decayed, rest = (len(g["params"]) for g in ours.param_groups)
    assert decayed and (rest or lora_rank)  # weights decay, biases and norms not (LoRA: none)


class DropsABranch(torch.nn.Module):
    """A forward pass that saves a storage for a part of the graph it drops (as a router's
    indices or an indexer's scores are): freed before the pass ends, its address free for the
    next storage saved."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        hidden = self.linear(x)
        (hidden * 3).pow(2).sum()  # its graph dropped at once: the product pow saved, freed
        return torch.sigmoid(hidden)


def test_cpu_activations_are_what_autograd_still_holds_at_the_end_of_the_forward_pass():
    """Probe and trace count the saved storages still held when the forward pass ends: one
    freed before was counted by both, and the probe, keyed by address, counted it or not as the
    allocator reused its address (DeepSeek-V3, Kimi-Linear: a few KiB apart, run to run)."""
    from anatomy.engine.probe import ComponentProbe
    from anatomy.prediction.tracing.tracker import LiveTensors, SavedForBackward

    model, x = DropsABranch().train(), torch.randn(4, 16)
    held = 2 * x.untyped_storage().nbytes()  # the linear's input, the sigmoid's output
    probe = ComponentProbe(model, use_cuda=False)  # a saved-tensor hook each: one at a time
    out = model(x)
    probe.close()
    assert probe.activations == held
    tracker = LiveTensors()
    saved = SavedForBackward(model, tracker)
    with tracker:
        out = model(x)
    assert saved.bytes == held == x.untyped_storage().nbytes() + out.untyped_storage().nbytes()


@pytest.mark.parametrize("length, padded", [(16, False), (13, True)])
def test_a_boolean_mask_reaches_the_kernel_additive_as_torch_makes_it(monkeypatch, length, padded):
    """torch's SDPA turns a boolean mask into an additive one of the query's dtype at every call,
    and the memory-efficient kernel takes it padded to strides of 8 elements, expanded over the
    heads: a new b × 1 × s × s tensor per layer that the kernel keeps for its backward pass
    (ModernBERT's sliding-window mask: 112 MiB the H200 grid of 2026-12-01 missed)."""
    from types import SimpleNamespace

    from anatomy.prediction.tracing import cuda

    seen = {}

    def efficient(query, key, value, mask, *rest, **kwargs):
        seen["mask"] = mask
        return (query.clone(),)

    monkeypatch.setattr(cuda, "aten", SimpleNamespace(
        _scaled_dot_product_efficient_attention=efficient))
    query = torch.randn(2, 4, length, 8, dtype=torch.bfloat16)
    mask = torch.ones(2, 1, length, length, dtype=torch.bool).tril()
    cuda.CudaKernels._kernel("efficient", query, query, query, mask, 0.0, False, None, False,
                             True)
    made = seen["mask"]
    assert made.dtype == torch.bfloat16 and made.shape == (2, 4, length, length)
    assert made.stride(1) == 0  # expanded over the heads, not copied per head
    assert torch.equal(made[:, 0].isinf(), ~mask[:, 0])
    row = made.untyped_storage().nbytes() // (2 * length * 2)
    assert row == (16 if padded else length)  # 13 keys padded to 16; 16 already aligned


def test_an_operator_the_trace_refuses_is_one_line_without_torchs_logged_traceback(
        tmp_path, caplog, monkeypatch):
    """FakeTensorMode logs the traceback of an operator whose meta kernel refuses its inputs
    before raising it (here SigLIP2's patch embedding given whole images, not the patches it
    wants); the prediction's answer is its one line, and nothing else reaches the terminal."""
    path = tmp_path / "siglip2.json"
    path.write_text(json.dumps({
        "model_type": "siglip2", "architectures": ["Siglip2ForImageClassification"],
        "vision_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "patch_size": 16, "num_patches": 16}}))

    def whole_images(spec, config, main, parameters, made):
        made["pixel_values"] = dummy_data.Tensor((3, 224, 224), dummy_data.NOISE)
        return "images"

    monkeypatch.setattr(dummy_data, "_image", whole_images)
    with caplog.at_level("DEBUG"), pytest.raises(PredictionError) as refused:
        predict(RunOptions(model=str(path), batch_size=2), device="cpu")
    assert "\n" not in str(refused.value) and "reduction dim" in str(refused.value)
    assert not [r for r in caplog.records if r.name.startswith("torch._subclasses")]


def _backward_peak(x, cuda_kernels: bool) -> int:
    """The live bytes' peak over the backward pass of softmax(x).sum(), traced on fake tensors
    with or without CUDA's kernels."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from anatomy.prediction.tracing.cuda import CudaKernels
    from anatomy.prediction.tracing.tracker import ALLOC, FREE, LiveTensors

    tracker = LiveTensors()
    with FakeTensorMode() as mode:
        x = mode.from_tensor(x).requires_grad_()
        with CudaKernels(DEFAULT, tracker) if cuda_kernels else nullcontext(), tracker:
            loss = torch.softmax(x, -1).sum()
            tracker.timeline.mark("backward")
            loss.backward()
    live, total, peak, started = {}, 0, 0, False
    for kind, tid, size in tracker.timeline.events:
        started = started or kind == 2
        if kind == ALLOC:
            live[tid] = size
            total += size
        elif kind == FREE:
            total -= live.pop(tid, 0)
        if started:
            peak = max(peak, total)
    return peak


def test_cudas_softmax_backward_holds_a_temporary_of_the_gradients_size():
    """CUDA's softmax backward computes `grad * output` into a temporary first (SoftMax.cu,
    softmax_backward_cuda_out): on the math attention one more b × h × s × s beside the
    gradients (SmolLM2 fp32 with checkpointing on the H200, 120 MiB); the CPU's kernel makes
    none."""
    x = torch.randn(2, 3, 8, 8)
    assert _backward_peak(x, True) - _backward_peak(x, False) == x.nbytes


@pytest.mark.parametrize("rows, dtype, staged", [(32 * 198, torch.float32, 38_928_384),
                                                 (64 * 198, torch.bfloat16, 77_856_768)])
def test_cudas_reduction_stages_a_long_sum_in_global_memory(rows, dtype, staged):
    """A bias's gradient, the sum of a (batch × tokens) × width gradient over its rows, runs
    CUDA's reduction split across thread blocks, whose partial sums go through a buffer in
    global memory (Reduce.cuh). The blocks the H200 held at DeiT-base's peak (2026-12-01
    snapshots: fp32 b32 and bf16 b64, fc2's bias, 768 wide, 198 tokens): that buffer and 24 B of
    semaphores, one per block column (and no accumulation buffer: the sum is one kernel). A
    reduction along each row's own width stages none (empty sizes)."""
    from anatomy.prediction.tracing.reductions import staging_buffers

    aten = torch.ops.aten
    gradient = torch.empty(rows, 768, dtype=dtype, device="meta")
    assert staging_buffers(aten.sum.dim_IntList, (gradient, [0], True), 132, 2048) \
        == [0, staged, 24]
    hidden = torch.empty(4, 512, 2048, dtype=dtype, device="meta")
    assert staging_buffers(aten.mean.dim, (hidden, [-1], True), 132, 2048) == [0, 0, 0]


def test_cudas_reduction_over_more_than_2_gib_runs_in_parts():
    """A sum whose input spans 2^31 bytes runs as 32-bit-indexable parts (TensorIterator's
    with_32bit_indexing: the rows halved), one kernel and one staging buffer each, the second
    in the first's freed block, and a bf16 output sums into an fp32 buffer held across them.
    What the H200's allocator recorded for DeiT-base bf16 at batch 1,916 (2026-12-02), the MLP's
    bias (3,072 wide, 1,916 × 198 rows, 2.3 GB): 12,288 B, then twice 292,552,704 B (the staging
    of 189,684 rows) and 96 B of semaphores; the 768-wide biases (0.6 GB) one kernel."""
    from anatomy.prediction.tracing.reductions import staging_buffers

    aten = torch.ops.aten
    wide = torch.empty(1916 * 198, 3072, dtype=torch.bfloat16, device="meta")
    assert staging_buffers(aten.sum.dim_IntList, (wide, [0], True), 132, 2048) \
        == [12_288, 292_552_704, 96]
    narrow = torch.empty(1916 * 198, 768, dtype=torch.bfloat16, device="meta")
    assert staging_buffers(aten.sum.dim_IntList, (narrow, [0], True), 132, 2048) \
        == [0, 145_883_136, 24]
    # an input broadcast over more than 2^31 elements (stride 0) is split by its count alone
    broadcast = torch.empty(1, 3072, dtype=torch.bfloat16, device="meta").expand(2**20, 3072)
    assert staging_buffers(aten.sum.dim_IntList, (broadcast, [0], True), 132, 2048)[0] == 12_288


def test_cudas_batch_norm_copies_a_bf16_input_too_large_for_32_bit_indexing():
    """CUDA's batch norm over more than 2^31 - 1 elements takes its general kernel, whose
    statistics (var_mean into fp32) reduce an fp32 copy of a bf16 input (Normalization.cu,
    ReduceOpsUtils.h), freed as it returns. What the H200's allocator recorded (2026-12-02):
    ResNet-50 bf16 at batch 3,254, 10,449,453,056 B at each of its five batch norms over
    64 × 112² or 256 × 56² elements a sample; EfficientNet-B0 bf16 at 3,250, 15,654,912,000 B
    at its one over 96 × 112². Below the limit, in fp32 or out of training: no copy; the empty
    size keeps its rule, so a batch size made linear from batch sizes 2 and 3 makes it."""
    from anatomy.prediction.tracing.reductions import batch_norm_buffers, extrapolated

    def buffers(batch, channels, side, dtype=torch.bfloat16, training=True):
        x = torch.empty(batch, channels, side, side, dtype=dtype, device="meta")
        return batch_norm_buffers((x, None, None, None, None, training, 0.1, 1e-5))

    assert buffers(3254, 64, 112) == [10_449_453_056]
    assert buffers(3250, 96, 112) == [15_654_912_000]
    assert buffers(3254, 64, 112, dtype=torch.float32) == []
    assert buffers(3254, 64, 112, training=False) == []
    assert buffers(2674, 64, 112) == [0]  # 2,146,729,984 elements: 32-bit indexable
    two, three = buffers(2, 64, 112)[0], buffers(3, 64, 112)[0]
    assert (two, three) == (0, 0)
    assert extrapolated(two, three, 3254 - 2) == 10_449_453_056


def test_the_edge_margin_is_the_largest_needed_plus_a_pad():
    """bench/prediction_grid.py fits the H200's edge margin on its fitting set's out-of-memory
    runs: the largest margin any of them is still held with, plus 0.05 % of the capacity; a run
    not held even at the capacity (-1) needs none, and the pad stays (it vanished once)."""
    from bench.prediction_grid import edge_margin

    assert edge_margin([-1.0, -1.0]) == 0.0005
    assert edge_margin([-1.0, 0.0058, 0.001]) == 0.0063


def _traced_backward(build, cuda_kernels: bool = False) -> list[tuple]:
    """The events of `build()(...)`'s backward pass (build returns the loss) traced on fake
    tensors, with or without CUDA's kernels."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from anatomy.prediction.tracing.cuda import CudaKernels
    from anatomy.prediction.tracing.tracker import LiveTensors

    tracker = LiveTensors()
    with FakeTensorMode():
        with CudaKernels(DEFAULT, tracker) if cuda_kernels else nullcontext(), tracker:
            loss = build()
            begins = len(tracker.timeline.events)
            loss.backward()
    return tracker.timeline.events[begins:]


class _SumsItself(torch.autograd.Function):
    """A backward formula with a sum of its own: `grad * 2 + grad`, really allocated."""

    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        return grad * 2 + grad


def test_autograd_sums_two_gradients_of_one_input_in_place():
    """An input that two operators use gets two gradients, which autograd's engine sums in
    place when it holds the only reference (input_buffer.cpp): the run allocates no sum. Under
    a dispatch mode, the tracker's, it sums out of place; the trace takes that allocation back
    (ELECTRA-large bf16 at batch 265 on the H200: four 530 MiB fp32 sums per layer and step the
    recorded actions lack). A sum a backward formula makes itself stays."""
    from anatomy.prediction.tracing.tracker import ALLOC

    n = 64 * 64 * 4
    x = torch.randn(64, 64)  # the real engine, no mode: the sum is the first gradient's storage
    x.requires_grad_()
    h = x * 2
    a, b = h * 3, h * 4
    pointers = {}

    def seen(name):
        def hook(grad_inputs, grad_outputs):
            pointers[name] = grad_inputs[0].data_ptr()
        return hook

    a.grad_fn.register_hook(seen("a"))
    b.grad_fn.register_hook(seen("b"))
    h.register_hook(lambda g: pointers.update(sum=g.data_ptr()))
    (a.sum() + b.sum()).backward()
    assert pointers["sum"] in (pointers["a"], pointers["b"])

    def two_uses():
        x = torch.randn(64, 64, requires_grad=True)
        h = x * 2
        return (h * 3).sum() + (h * 4).sum()

    # each branch's gradient of h, then x's: no third, the sum
    assert [e[2] for e in _traced_backward(two_uses) if e[0] == ALLOC and e[2] == n] == [n] * 3

    def formula():
        x = torch.randn(64, 64, requires_grad=True)
        return _SumsItself.apply(x).sum()

    # grad * 2, then its sum with grad: both allocated (the first, made by the formula, freed)
    assert [e[2] for e in _traced_backward(formula) if e[0] == ALLOC and e[2] == n] == [n] * 2


def test_autograd_sums_into_a_view_out_of_place():
    """The engine sums in place only into a storage it alone holds; a view shares its base's
    (`storage().use_count()` 2): a tied embedding's weight gets the head's gradient as a
    transpose, and the engine allocates the sum (Qwen2.5-1.5B fp32 with checkpointing on the
    H200: predicted 890 MiB low while the trace summed it in place). The real engine, read by
    torch's profiler (no dispatch mode), and the trace agree."""
    from torch.profiler import ProfilerActivity, profile

    from anatomy.prediction.tracing.tracker import ALLOC

    def tied():
        torch.manual_seed(0)
        embedding = torch.nn.Embedding(100, 16)
        head = torch.nn.Linear(16, 100, bias=False)
        head.weight = embedding.weight
        return head(embedding(torch.randint(0, 100, (4, 8)))).sum()

    loss = tied()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as real:
        loss.backward()
    sums = [e.name for e in real.events()
            if e.name in ("aten::add", "aten::add_") and e.input_shapes[:1] == [[100, 16]]]
    assert sums == ["aten::add"]  # out of place: a new storage
    # the embedding's gradient, the head's, and their sum
    n = 100 * 16 * 4
    assert [e[2] for e in _traced_backward(tied) if e[0] == ALLOC and e[2] == n] == [n] * 3


def test_cudas_dropout_allocates_its_mask_before_its_output():
    """dropout_cuda (Dropout.cu) makes the 1-byte mask, then the output; as recorded on the
    H200 (ELECTRA-large bf16 at 265: 138,936,320 B, then 555,745,280 B)."""
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode

    from anatomy.prediction.tracing.cuda import CudaKernels
    from anatomy.prediction.tracing.tracker import ALLOC, LiveTensors

    tracker = LiveTensors()
    with FakeTensorMode():
        x = torch.randn(265 * 512, 1024)
        with CudaKernels(DEFAULT, tracker), tracker:
            F.dropout(x, 0.1, training=True)
    assert [e[2] for e in tracker.timeline.events if e[0] == ALLOC] == \
        [138_936_320, 555_745_280]


def test_cudas_in_place_dropout_keeps_noise_of_the_inputs_dtype():
    """`dropout_` never takes CUDA's fused kernel (Dropout.cpp `_dropout_impl<true>`): its noise
    has the input's dtype and is multiplied in place, no 1-byte mask, no new output. HF
    MobileNetV2's classifier drops in place: on the H200 at 1,826 an fp32 noise of 9,349,120 B
    (1,826 × 1,280 × 4), where the trace had made a 2,337,280 B mask."""
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode

    from anatomy.prediction.tracing.cuda import CudaKernels
    from anatomy.prediction.tracing.tracker import ALLOC, LiveTensors

    tracker = LiveTensors()
    with FakeTensorMode():
        with CudaKernels(DEFAULT, tracker), tracker:
            x = torch.randn(1826, 1280)
            out = F.dropout(x, 0.8, training=True, inplace=True)
    # the input, then the noise; nothing else
    assert [e[2] for e in tracker.timeline.events if e[0] == ALLOC] == [9_349_120, 9_349_120]
    assert out is x


def test_cublas_forward_workspaces_are_two_blocks_the_handles_and_cublaslts():
    """The forward pass's first matrix product allocates its cuBLAS handle's workspace, then
    cuBLASLt's (the linear layers' fused bias): on the H200 33,554,432 B then 1,048,576 B (every
    recorded run with biases: ELECTRA-large, DeiT-base, EfficientNet-B0), the second in the small
    pool. One block of 34,603,008 B put ELECTRA-large bf16 at 266 one 20 MiB segment short after
    its first step, so that the trace never released its cache as the run did, and held a batch
    size the H200 did not. The backward thread's handle: its workspace alone."""
    from anatomy.prediction import device_constants
    from anatomy.prediction.tracing.cuda import _workspaces

    h200 = device_constants.load("NVIDIA H200")
    assert _workspaces(h200, "forward") == [33_554_432, 1_048_576]
    assert _workspaces(h200, "backward") == [33_554_432]
    same = dataclasses.replace(h200, workspace_forward_bytes=h200.workspace_backward_bytes)
    assert _workspaces(same, "forward") == [33_554_432]


def test_cudas_autocast_runs_cross_entropys_log_softmax_in_the_inputs_dtype():
    """CUDA's autocast lists nll_loss, not cross_entropy_loss (the CPU's lists both): a bf16
    input's log-probabilities stay bf16, and nll_loss gets an fp32 copy of them. As recorded on
    the H200 (Flan-T5-small bf16 s512 at 224, each step: 7,369,392,128 B then 14,738,784,256 B
    and the loss's two scalars; in the backward pass nll_loss's fp32 gradient, then two bf16
    ones, the copy's and log_softmax's). The CPU's order made the first block fp32 too."""
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode

    from anatomy.prediction.tracing.cuda import CudaKernels
    from anatomy.prediction.tracing.tracker import ALLOC, MARK, LiveTensors

    tracker = LiveTensors()
    with FakeTensorMode():
        logits = torch.randn(224 * 512, 32128, dtype=torch.bfloat16, requires_grad=True)
        labels = torch.randint(0, 32128, (224 * 512,))
        with CudaKernels(DEFAULT, tracker), tracker:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(logits, labels)
            tracker.timeline.mark("backward")
            loss.backward()
    events = tracker.timeline.events
    backward = next(i for i, e in enumerate(events) if e[0] == MARK)
    made = [[e[2] for e in part if e[0] == ALLOC and e[2] > 4]
            for part in (events[:backward], events[backward:])]
    assert made == [[7_369_392_128, 14_738_784_256],
                    [14_738_784_256, 7_369_392_128, 7_369_392_128]]


@pytest.mark.parametrize("rows, features, buffer, staging, semaphores", [
    (265 * 512, 1024, 4_194_304, 8_388_608, 32),  # ELECTRA-large bf16 at 265
    (1916 * 197, 768, 4_193_280, 8_650_752, 24),  # DeiT-base bf16 at 1,916
])
def test_cudas_layer_norm_backward_sums_its_weights_gradients_in_parts(
        rows, features, buffer, staging, semaphores):
    """With many rows and few features, layer norm's backward (layer_norm_kernel.cu) writes
    the weight's and the bias's gradients as partial sums, one (blocks × features) fp32 buffer
    each, then sums each (a reduction with its own staging buffer and semaphores). The H200's
    recorded actions: these bytes, in this order. With fewer rows than 64 Ki, none."""
    from anatomy.prediction.tracing.layer_norm import backward_buffers

    steps = backward_buffers((rows, features), 1, 4, 2, 132, 2048)
    made = [int(size) for action, size in steps if action == "alloc" and size]
    sum_ = [features * 4, staging, semaphores]
    assert made == [buffer, buffer, *sum_, *sum_]
    assert [a for a, _ in steps] == ["alloc"] * 2 + (["alloc"] * 4 + ["free"] * 4) * 2 + \
        ["free"] * 2
    assert not any(backward_buffers((2 * 512, features), 1, 4, 2, 132, 2048)[i][1]
                   for i in range(10))


@pytest.mark.parametrize("runs, low, high, largest", [
    # RegNet-Y-040 fp32's edge on the H200 (session 28 and 29): ragged.
    ({1306, 1312, 1325, 1333, 1334, 1335, 1348}, 1306, 1362, 1348),
    ({1306, 1312, 1325, 1333, 1334, 1335}, 1306, 1362, 1335),
    (set(range(1306, 1321)) | {1340}, 1306, 1362, 1340),  # bisection alone: 1,320
    (set(range(1, 1700)), 1600, 1690, 1699),  # not ragged: past `high`, widened
    ({5}, 40, 60, 5),  # `low` does not fit: halved until one does
    (set(), 40, 60, 0),  # nothing fits
])
def test_the_largest_size_that_fits_down_a_ragged_edge(runs, low, high, largest):
    """The measured search (memory._largest): bisection finds a size that fits with the next
    out of memory, then the sizes above it, down from the top, give the largest that fits —
    what `sweep --from-prediction` confirms (it runs, the next does not)."""
    from anatomy.prediction.memory import _largest

    asked = []

    def fits(batch):
        asked.append(batch)
        return batch in runs

    found = _largest(fits, low, high)
    assert found == largest and (found + 1) in asked and (found + 1) not in runs
    assert len(set(asked)) <= 64  # sizes near the edge, not every size


def test_the_size_sure_to_fit_is_found_down_a_ragged_edge():
    """What fits with the edge margin alone: the allocator's edge may be ragged (DeiT-base bf16
    on the H200: 1,916 and 1,918 ran, 1,917 and 1,919 did not); the sizes between bisection's
    answer and the largest that may fit are checked down from the top. With the convolution
    margin (fitted on bisection's answers) they are not."""
    from types import SimpleNamespace

    from anatomy.prediction.memory import _search

    capacity, pad = 1000, 10

    def out_of_memory(batch, room):
        if room == capacity - pad:  # with the pad: ragged
            return not (batch <= 100 or batch == 104)
        return batch > 105

    sizes = SimpleNamespace(out_of_memory=out_of_memory)
    assert _search(sizes, capacity, 0, pad) == (100, 105)
    assert _search(sizes, capacity, 0, pad, scan=True) == (104, 105)


def test_a_measured_workspace_between_two_sizes_is_linear_in_the_batch_size():
    from anatomy.prediction.workspaces import Table

    key = ((8, 32, 32), (8, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1, "float32", "contiguous", None)
    table = Table({key: {100: ((1000,), (300, 40)), 200: ((3000,), (500, 40))}})
    assert table.size(key, "forward", 0, 150, True) == 2000  # between: linear
    assert table.size(key, "forward", 0, 400, True) == 6000  # beyond: the nearest's per sample
    assert table.size(key, "data", 0, 100, True) == 300
    assert table.size(key, "data", 0, 100, False) == 0  # no data gradient: no data workspace
    assert table.size(key, "filter", 0, 200, True) == 40
    assert table.most(key, "data", True) == 1 and table.most(key, "forward", True) == 1



"""The traced prediction's parts: weights, gradients and states as the built model holds them,
LoRA's adapters, the CUDA side's parts that a CPU can check, and figures measured on an H200
(bert-large, torch 2.11) that the method was never fitted to. (Held against real tensors, the
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
from anatomy.prediction import (
    CPU_PROCESS,
    WALKTHROUGH_BYTES_PER_PARAMETER,
    Prediction,
    PredictionError,
    capacity_for,
    max_batch_size,
    predict,
    walkthrough_bytes_per_parameter,
)
from anatomy.prediction.device_constants import DEFAULT, sdpa_signature
from anatomy.prediction.step import TracedRun
from anatomy.prediction.tracing.record import record
from anatomy.prediction.tracing.trainer_step import (
    StepOptions,
    make_optimizer,
    training_arguments,
)
from anatomy.vocabulary import Optimizer

MIB = 2**20
TINY = ("tiny", "tiny-gpt2", "tiny-llama", "tiny-qwen2", "tiny-vit")


@pytest.mark.parametrize("name", TINY)
def test_weights_gradients_and_states_are_the_built_models(name):
    spec = models.resolve(name)
    options = StepOptions("fp32", False, 1, "adamw_torch", 2, 8)
    recording = record(spec, options, kernels="cpu", steps=1)
    model, _ = models.build_model(spec, "meta", pretrained=False)
    parameters = sum(p.numel() for p in model.parameters())
    assert recording.parameters == recording.trainable_parameters == parameters
    assert recording.weights_bytes == recording.gradient_bytes  # fp32 weights, fp32 gradients
    assert recording.optimizer_state_bytes == 2 * recording.weights_bytes  # AdamW's moments


def test_lora_trains_only_the_adapters_and_shrinks_gradients_and_states():
    spec = models.resolve("tiny-llama")
    full = predict(RunOptions(model="tiny-llama", seq_len=16, batch_size=2), device="cpu")
    lora = predict(RunOptions(model="tiny-llama", seq_len=16, batch_size=2, lora_rank=4),
                   device="cpu")
    # q_proj and v_proj of 2 layers, rank 4: A is 4×64, B 64×4 (q) and 32×4 (v, 2 kv heads)
    expected = 2 * ((4 * 64 + 64 * 4) + (4 * 64 + 32 * 4))
    assert lora.trainable_parameters == expected
    assert lora.gradients == 4 * expected and lora.optimizer_states == 8 * expected
    assert lora.parameters == full.parameters + expected
    assert lora.weights == 4 * lora.parameters
    assert lora.peak < full.peak
    assert spec.task == models.CAUSAL_LM


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


def test_cuda_figures_add_workspaces_and_round_to_the_allocators_blocks():
    options = RunOptions(model="tiny-gpt2", seq_len=16, batch_size=2)
    without = dataclasses.replace(DEFAULT, workspace_forward_bytes=0, workspace_backward_bytes=0)
    bare = predict(options, device="cuda", calibration=without)
    full = predict(options, device="cuda", calibration=DEFAULT)
    workspaces = DEFAULT.workspace_forward_bytes + DEFAULT.workspace_backward_bytes
    assert full.peak - bare.peak == workspaces  # both are alive at the peak, once each
    assert bare.peak % 512 == 0 and bare.peak_reserved % (2 * MIB) == 0
    assert bare.peak_reserved >= bare.peak
    assert full.nvml_peak == DEFAULT.context_bytes + full.peak_reserved + DEFAULT.outside_bytes


def test_the_attention_kernel_is_the_calibrated_devices_choice():
    options = RunOptions(model="tiny-llama", seq_len=16, batch_size=2, precision="bf16")
    assert set(predict(options, device="cuda", calibration=DEFAULT).attention_kernels) \
        == {"flash"}  # 16-bit, no mask: flash on a Hopper GPU without calibration
    signature = sdpa_signature("bfloat16", 16, True, False, False, True, True)
    math = dataclasses.replace(DEFAULT, sdpa_backends={signature: "math"})
    on_math = predict(options, device="cuda", calibration=math)
    assert set(on_math.attention_kernels) == {"math"}
    # the math kernel keeps fp32 s×s attention matrices: more activations than flash
    assert on_math.activations > predict(options, device="cuda", calibration=DEFAULT).activations


def test_a_mask_whose_last_dimension_is_strided_takes_the_math_kernel(tmp_path, monkeypatch):
    """Every fused attention kernel on a GPU requires the mask's last dimension to have stride 1
    (torch's check_last_dim_stride_equals_1_dense). T5's relative position bias is a permuted
    view of its embedding, heads innermost: transformers 5.17 hands it to SDPA as it is (5.23
    makes it contiguous first), and the H200 runs the math kernel, holding s × s matrices the
    memory-efficient kernel it calibrated for the same bias made contiguous never holds."""
    from transformers.integrations import sdpa_attention

    from anatomy.prediction import device_constants, memory
    from anatomy.prediction.device_constants import mask_kind

    h200 = device_constants.load("NVIDIA H200")
    query = torch.zeros(2, 6, 16, 64)
    bias = torch.zeros(16, 16, 6, requires_grad=True).permute(2, 0, 1).unsqueeze(0)
    kinds = {mask_kind(mask, query, query) for mask in (bias, bias.to(torch.bfloat16))}
    assert kinds == {"strided"}  # a 16-bit copy keeps the layout (autocast's preserve format)
    for made in (bias.contiguous(), bias):
        signature = sdpa_signature("float32", 64, False, mask_kind(made, query, query), True,
                                   False, True)
        assert h200.sdpa_backend(signature) == ("math" if made is bias else "efficient")

    path = tmp_path / "t5.json"
    path.write_text(json.dumps({
        "model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "d_model": 64,
        "d_kv": 16, "d_ff": 128, "num_heads": 4, "num_layers": 2, "vocab_size": 128,
        "dropout_rate": 0.1, "decoder_start_token_id": 0, "pad_token_id": 0}))
    options = RunOptions(model=str(path), seq_len=32, batch_size=2)
    contiguous = predict(options, device="cuda", calibration=h200)
    made_contiguous = sdpa_attention.create_position_bias_mask

    def as_517(position_bias, attention_mask, is_causal, query, key):
        if attention_mask is None and not is_causal:  # the encoder's: the bias itself
            return position_bias
        return made_contiguous(position_bias, attention_mask, is_causal, query, key)

    monkeypatch.setattr(sdpa_attention, "create_position_bias_mask", as_517)
    monkeypatch.setenv("ANATOMY_CACHE", "off")  # the same options, traced again
    memory._cached_recording.cache_clear()
    strided = predict(options, device="cuda", calibration=h200)
    assert set(contiguous.attention_kernels) == {"efficient"}
    assert strided.attention_kernels.count("math") == 2  # the encoder's two self-attentions
    assert strided.activations > contiguous.activations


def test_checkpointing_cuts_activations_and_accumulation_holds_gradients():
    base = RunOptions(model="tiny-qwen2", seq_len=64, batch_size=4)
    plain = predict(base, device="cuda")
    checkpointed = predict(dataclasses.replace(base, gradient_checkpointing=True), device="cuda")
    assert checkpointed.activations < plain.activations / 2
    accumulated = predict(dataclasses.replace(base, grad_accum=2), device="cuda")
    assert accumulated.moments["forward pass"] >= plain.moments["forward pass"] + plain.gradients


def test_a_cpus_capacity_is_its_ram_less_the_processs_measured_share():
    """In a container of 1.2 GiB, "not even batch size 1 is predicted to fit" (2 GiB were kept
    for the process) while tiny at 32 × 256 tokens ran in 900 MiB. The process's share is the
    one measured of CPU runs (bench/cpu_process_share.py, cpu_process.json): the tensors at the
    capacity and the process beside them fill the RAM."""
    ram = 1200 * MIB
    capacity = capacity_for("cpu", ram, None)
    assert capacity == CPU_PROCESS.capacity(ram) > 0
    assert ram - MIB < capacity + CPU_PROCESS.share(capacity) <= ram
    assert CPU_PROCESS.measured.startswith("bench/cpu_process_share.py on ")
    fit = max_batch_size(RunOptions(model="tiny", seq_len=256), device="cpu", total=ram)
    assert fit.batch_size is not None and fit.batch_size >= 32, fit.line("1.2 GiB")


def test_a_search_that_reaches_the_batch_size_limit_says_so():
    fit = max_batch_size(RunOptions(model="tiny-gpt2", seq_len=8), device="cuda",
                         total=DEFAULT.total_bytes)
    assert fit.batch_size == fit.limit == 4096 and fit.at_limit
    assert ": ≥ 4096 (peak" in fit.line("NVIDIA H200") and "limit" in fit.line("NVIDIA H200")


# Measured on an NVIDIA H200 (torch 2.11, transformers 5.17) under the Trainer, bert-large,
# batch size 4, sequence length 512, third step: torch.cuda.memory_allocated at the end of the
# forward pass minus its start (activations) and max_memory_allocated (peak), MiB. Nothing of
# the prediction was fitted to these (docs/MEASUREMENTS.md, section 2; docs/PREDICTION.md).
H200 = [
    (dict(), 3189.8, 7158.6),
    (dict(gradient_checkpointing=True), 210.1, 6460.0),
    (dict(precision="bf16"), 2607.8, 6577.6),
    (dict(optim="sgd"), 3189.8, 4599.1),
]


@pytest.mark.parametrize("changes, activations_mib, peak_mib", H200)
def test_bert_large_on_the_h200_within_one_percent(changes, activations_mib, peak_mib):
    p = predict(RunOptions(model="bert-large-uncased", batch_size=4, seq_len=512, **changes),
                device="cuda", calibration=DEFAULT)
    assert p.activations / MIB == pytest.approx(activations_mib, rel=0.001)
    assert p.peak / MIB == pytest.approx(peak_mib, rel=0.01)


def test_bytes_per_parameter_next_to_the_walkthrough():
    options = RunOptions(model="tiny", precision="bf16", seq_len=16)
    ours = predict(options, device="cpu").bytes_per_parameter()
    assert ours["weights"] == ours["gradients"] == 4 and ours["optimizer_states"] == 8
    assert walkthrough_bytes_per_parameter(options) == {
        "weights": 6.0, "gradients": 4.0, "optimizer_states": 8.0}
    assert walkthrough_bytes_per_parameter(RunOptions(optim="adafactor"))["optimizer_states"] is None
    assert WALKTHROUGH_BYTES_PER_PARAMETER["mixed precision AdamW, all three (plus activations)"] \
        == 6 + 4 + 8
    assert isinstance(predict(options, device="cpu"), Prediction)


def test_a_float_mask_reaches_the_attention_kernel_in_16_bits(tmp_path, monkeypatch):
    """CUDA's autocast casts every floating argument of attention, the mask too: ALiBi's float
    bias (Falcon-RW) reaches the kernel as a 16-bit copy made at each call, which the kernel
    keeps for its backward pass (on the H200 a b × h × s × s tensor per layer)."""
    from anatomy.prediction.tracing.cuda import CudaKernels

    config = {"model_type": "falcon", "architectures": ["FalconForCausalLM"], "alibi": True,
              "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
              "vocab_size": 128, "new_decoder_architecture": False, "multi_query": False,
              "parallel_attn": False, "bias": True}
    path = tmp_path / "falcon.json"
    path.write_text(json.dumps(config))
    masks = []
    kernel = CudaKernels._kernel

    def seen(backend, query, key, value, attn_mask, *rest):
        masks.append(attn_mask.dtype if attn_mask is not None else None)
        return kernel(backend, query, key, value, attn_mask, *rest)

    monkeypatch.setattr(CudaKernels, "_kernel", staticmethod(seen))
    predict(RunOptions(model=str(path), seq_len=16, batch_size=2, precision="bf16"),
            device="cuda", calibration=DEFAULT)
    assert masks and set(masks) == {torch.bfloat16}


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


def _made_linear_is_traced(options: RunOptions, batch: int) -> None:
    """`batch`, made linear from batch sizes 2 and 3 for an H200, replays as its own trace."""
    from anatomy.prediction.memory import BatchSizes, calibration_for

    calibration = calibration_for("cuda", "NVIDIA H200")
    linear = BatchSizes(options, "cuda", calibration)
    traced = BatchSizes(options, "cuda", calibration)
    traced._recorded[batch] = traced._record(batch)
    made, own = linear.measure(batch), traced.measure(batch)
    assert linear.linear
    assert (made.peak_allocated, made.peak_reserved, made.largest_request) == \
        (own.peak_allocated, own.peak_reserved, own.largest_request)


def test_a_batch_size_made_linear_stages_what_its_own_trace_stages():
    """"What fits" makes a batch size's recording linear from batch sizes 2 and 3; a reduction's
    staging buffer is not linear (its split changes regime as the rows grow: made linear, the
    tiny model's bias sums at batch 800 staged 4x what its own trace stages, and the largest
    batch predicted for ELECTRA-large on the H200 fell from 264 to 257). It is made again from
    the reduction's layout, which is linear: the same replay as the size traced on its own."""
    options = RunOptions(preset="tiny", precision="bf16", seq_len=128, batch_size=1)
    _made_linear_is_traced(options, 800)


def test_a_batch_size_made_linear_stages_at_any_depth(tmp_path):
    """The same on a model whose layers are traced at four and extrapolated (memory's shallow
    trace, layers.extrapolate): its reductions' staging sizes keep their layouts through the
    depth extrapolation. They were made plain numbers there, so every batch size made linear
    staged what batch sizes 2 and 3 stage, nothing: DeiT-base bf16 at 1,916 on the H200
    (2026-12-02) lacked its bias sums' 139 MiB buffers and may have fitted up to 1,918, where
    1,917 ran out of memory."""
    from anatomy.prediction import layers

    config = dict(models.resolve("tiny").config, num_hidden_layers=layers.DEPTH + 2)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    options = RunOptions(model=str(path), precision="bf16", seq_len=128, batch_size=1)
    _made_linear_is_traced(options, 800)


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


def test_a_layer_norm_made_linear_sums_in_parts_as_its_own_trace():
    """At batch sizes 2 and 3 layer norm's backward sums directly; a batch size made linear
    from them, past 64 Ki rows, makes the partial buffers its own trace makes."""
    options = RunOptions(preset="tiny", precision="bf16", seq_len=512, batch_size=1)
    _made_linear_is_traced(options, 300)


def test_a_convolution_network_keeps_the_convolution_margin_a_vit_does_not(tmp_path):
    """cuDNN's workspaces are not traced (tracing/cuda.py): "What fits" keeps the device's
    convolution margin free in the share of the forward passes' results the convolutions make —
    most of a ResNet's, next to nothing of a ViT's (its one patch embedding) — and says why."""
    from anatomy.prediction import BatchSizes, memory

    config = {"model_type": "resnet", "architectures": ["ResNetForImageClassification"],
              "embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1],
              "layer_type": "basic", "image_size": 32, "num_labels": 10}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    resnet, vit = RunOptions(model=str(path)), RunOptions(model="tiny-vit")

    def share(options: RunOptions, device: str) -> float:
        return memory._recording(TracedRun.of(options), device,
                                 DEFAULT if device == "cuda" else None, 1).convolution_share

    assert share(resnet, "cuda") > 0.15 and 0 < share(vit, "cuda") < 0.02
    assert share(resnet, "cpu") == 0  # the CPU's convolutions: traced as they run
    measured = BatchSizes(resnet, "cuda", DEFAULT).measure(64)  # the capacity: batch 64's reserve
    total = round((measured.peak_reserved + DEFAULT.context_bytes + DEFAULT.outside_bytes)
                  * DEFAULT.total_bytes / DEFAULT.usable(DEFAULT.total_bytes))

    def fit(margin: float):
        calibration = dataclasses.replace(DEFAULT, edge_margin=0.0, convolution_margin=margin)
        return max_batch_size(resnet, device="cuda", total=total, calibration=calibration)

    without, kept = fit(0.0), fit(0.1)
    assert without.batch_size == without.may_fit and 64 <= without.batch_size < 128, without
    assert kept.may_fit == without.may_fit and kept.batch_size < without.batch_size
    assert kept.uncertain and kept.convolutions
    assert "cuDNN chooses its convolutions' workspaces" in kept.line("the GPU")
    assert "cuDNN" not in without.line("the GPU")


def test_measured_workspaces_take_the_convolution_margins_place(tmp_path):
    """`predict --max-batch-size --measure-convolutions`: the run's distinct convolutions are
    handed to the measurement at the margin's answers first, then at every batch size the
    search replays near the edge, each size with its own workspaces (prediction/workspaces.py)
    in place of the margin: none leaves the answer the margin-free one; large ones lower it;
    one that jumps between two neighbouring sizes (cuDNN changing engines) sets the answer
    exactly where it jumps, which no line between two measured sizes would. A model without
    convolutions measures nothing."""
    from anatomy.prediction import BatchSizes, workspaces

    config = {"model_type": "resnet", "architectures": ["ResNetForImageClassification"],
              "embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1],
              "layer_type": "basic", "image_size": 32, "num_labels": 10}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    resnet = RunOptions(model=str(path))
    measured = BatchSizes(resnet, "cuda", DEFAULT).measure(64)
    total = round((measured.peak_reserved + DEFAULT.context_bytes + DEFAULT.outside_bytes)
                  * DEFAULT.total_bytes / DEFAULT.usable(DEFAULT.total_bytes))
    calibration = dataclasses.replace(DEFAULT, edge_margin=0.0, convolution_margin=0.1)
    asked = []

    def measure_with(per_sample):
        def measure(keys, batches):
            asked.append((keys, batches))
            return workspaces.Table({key: {b: ((per_sample(b) * b,), (per_sample(b) * b,) * 2)
                                           for b in batches} for key in keys})
        return measure

    def fit(measure=None):
        return max_batch_size(resnet, device="cuda", total=total, calibration=calibration,
                              measure=measure)

    margin = fit()
    free = fit(measure_with(lambda b: 0))
    keys, first = asked[0]
    assert len(keys) == len(set(keys)) >= 4 and all(k[6] == "float32" for k in keys)
    assert first == [margin.batch_size, margin.may_fit + 1]
    assert all(len(batches) == 1 and k == keys for k, batches in asked[1:])
    sizes = {b for _, batches in asked for b in batches}
    assert set(free.searched) <= sizes  # every size replayed was measured, none interpolated
    assert free.workspaces_measured and not free.convolutions
    assert free.batch_size == free.may_fit == margin.may_fit > margin.batch_size
    assert "measured on this GPU" in free.line("the GPU")
    large = fit(measure_with(lambda b: measured.peak_allocated // 64 // 4))
    assert large.batch_size < free.batch_size
    edge = (margin.batch_size + margin.may_fit) // 2
    jump = fit(measure_with(lambda b: 0 if b <= edge else measured.peak_allocated))
    assert jump.batch_size == edge and {edge, edge + 1} <= set(jump.searched)
    asked.clear()
    plain = max_batch_size(RunOptions(preset="tiny"), device="cuda", total=total,
                           calibration=calibration, measure=measure_with(lambda b: 0))
    assert asked == [] and not plain.workspaces_measured


def test_the_convolutions_measured_are_keyed_by_their_memory_layouts(tmp_path):
    """cuDNN picks engines, and so workspaces, by the layouts too: ConvNeXt's blocks permute, so
    its convolutions after the stem take channels-last inputs, and a backward call's output
    gradient comes in a layout of its own; a ResNet's are contiguous throughout. The keys the
    measurement gets say which (prediction/workspaces.py), forward and backward apart."""
    from anatomy.prediction import BatchSizes, workspaces

    def logged(config):
        path = tmp_path / f"{config['model_type']}.json"
        path.write_text(json.dumps(config))
        seam = workspaces.Placeholders()
        BatchSizes(RunOptions(model=str(path), precision="bf16"), "cuda", DEFAULT,
                   workspaces=seam)
        return list(seam.keys)

    convnext = logged({"model_type": "convnext", "architectures": ["ConvNextForImageClassification"],
                       "hidden_sizes": [8, 16], "depths": [1, 1], "num_stages": 2, "image_size": 32,
                       "num_labels": 10})
    layouts = {(key[1], key[7], key[8]) for key in convnext}
    stem, depthwise = (8, 3, 4, 4), (8, 1, 7, 7)
    assert (stem, workspaces.CONTIGUOUS, None) in layouts  # the pixels
    assert (depthwise, workspaces.CHANNELS_LAST, None) in layouts
    assert (depthwise, workspaces.CHANNELS_LAST, workspaces.CHANNELS_LAST) in layouts
    assert {key[8] for key in convnext} == {None, workspaces.CONTIGUOUS, workspaces.CHANNELS_LAST}
    resnet = logged({"model_type": "resnet", "architectures": ["ResNetForImageClassification"],
                     "embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1],
                     "layer_type": "basic", "image_size": 32, "num_labels": 10})
    assert {(key[7], key[8]) for key in resnet} == {(workspaces.CONTIGUOUS, None),
                                                    (workspaces.CONTIGUOUS, workspaces.CONTIGUOUS)}


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



def test_nvml_is_a_band_where_cudnns_workspaces_are_not_measured(tmp_path):
    """cuDNN's convolution workspaces are chosen as the run goes (not traced): a convolution
    network's NVML figure is a band, from the traced one up to the device's `workspace_band` of
    the convolutions' share of the peak (ResNet-50 bf16 b256 on an H100: 2,111 MiB above the
    traced figure); measured on this GPU at the run's batch size, each call's workspace is in
    the trace instead and there is no band. A transformer without convolutions has none."""
    from anatomy.prediction import measured_recording, memory, workspaces

    config = {"model_type": "resnet", "architectures": ["ResNetForImageClassification"],
              "embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1],
              "layer_type": "basic", "image_size": 32, "num_labels": 10}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    resnet = RunOptions(model=str(path), batch_size=64)
    traced = predict(resnet, device="cuda", calibration=DEFAULT)
    share = memory._recording(TracedRun.of(resnet), "cuda", DEFAULT, traced.steps
                              ).convolution_share
    assert traced.workspace_band == round(DEFAULT.workspace_band * share * traced.peak) > 0
    assert traced.nvml_high == traced.nvml_peak + traced.workspace_band
    assert "up to" in traced.need_line() and "not traced" in traced.need_line()
    assert predict(RunOptions(model="tiny-gpt2", seq_len=16), device="cuda",
                   calibration=DEFAULT).nvml_high is None
    asked = []

    def measure(keys, batches):
        asked.append(batches)
        return workspaces.Table({key: {b: ((b * 2**20,), (b * 2**20,) * 2) for b in batches}
                                 for key in keys})

    recorded = measured_recording(resnet, DEFAULT, measure)
    assert asked == [[64]]
    measured = predict(resnet, device="cuda", calibration=DEFAULT, measured=recorded)
    assert measured.workspaces_measured and measured.nvml_high is None
    assert "measured on this GPU" in measured.need_line()
    # 64 MiB workspaces, one call at a time: the reserve holds them, the tensors' peak may too
    assert measured.peak_reserved >= traced.peak_reserved + 64 * 2**20
    assert measured_recording(RunOptions(model="tiny-gpt2", seq_len=16), DEFAULT, measure) is None

"""The traced prediction's parts that trace a model for seconds a case (moved from the edit loop's
tests/unit/test_prediction.py, which keeps the kernels' and the searches' parts traced on a few
fake tensors): weights, gradients and states as the built model holds them, LoRA's adapters,
FSDP's shards, the CUDA side's parts that a CPU can check on whole models, the batch sizes made
linear, the convolutions' margin and measured workspaces, and figures measured on an H200
(bert-large, torch 2.11) that the method was never fitted to; the Live form's warning of a
batch too large for the GPU."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

import pytest
import torch

from anatomy.analysis import models
from anatomy.analysis.options import RunOptions, validated
from anatomy.prediction import (
    CPU_PROCESS,
    WALKTHROUGH_BYTES_PER_PARAMETER,
    Prediction,
    capacity_for,
    max_batch_size,
    predict,
    walkthrough_bytes_per_parameter,
)
from anatomy.prediction.device_constants import DEFAULT, sdpa_signature
from anatomy.prediction.step import TracedRun
from anatomy.prediction.tracing.record import record
from anatomy.prediction.tracing.trainer_step import StepOptions
from anatomy.views.live import batch_size_forecast, memory_forecast
from tests.helpers import resnet_config
from tests.unit.test_live_page_forecast import H200 as H200_MACHINE

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

    path = resnet_config(tmp_path)
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

    path = resnet_config(tmp_path)
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
    resnet = logged(json.loads(resnet_config(tmp_path).read_text()))
    assert {(key[7], key[8]) for key in resnet} == {(workspaces.CONTIGUOUS, None),
                                                    (workspaces.CONTIGUOUS, workspaces.CONTIGUOUS)}


def test_nvml_is_a_band_where_cudnns_workspaces_are_not_measured(tmp_path):
    """cuDNN's convolution workspaces are chosen as the run goes (not traced): a convolution
    network's NVML figure is a band, from the traced one up to the device's `workspace_band` of
    the convolutions' share of the peak (ResNet-50 bf16 b256 on an H100: 2,111 MiB above the
    traced figure); measured on this GPU at the run's batch size, each call's workspace is in
    the trace instead and there is no band. A transformer without convolutions has none."""
    from anatomy.prediction import measured_recording, memory, workspaces

    path = resnet_config(tmp_path)
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


def _gathered_most(recording) -> int:
    """The most bytes of FSDP's all-gather buffers alive at once in a traced step."""
    from anatomy.prediction import replay
    from anatomy.strategies.fsdp import ALL_GATHER

    live, most = {}, 0
    gathered = recording.rank_buffers[ALL_GATHER]
    for kind, tid, size in recording.events[recording.segments["batches"][0]:]:
        if kind == replay.ALLOC and tid in gathered:
            live[tid] = size
        elif kind == replay.FREE:
            live.pop(tid, None)
        most = max(most, sum(live.values()))
    return most


@pytest.mark.parametrize("world", [2, 4])
def test_an_fsdp_rank_holds_its_shards_and_gathers_in_the_mixed_precision(world):
    """FSDP2 traced (tracing/fsdp.py): a rank's weights, gradients and states are a 1/N shard
    (each parameter padded to a multiple of N on its first dimension), and with bf16 its
    all-gathers carry 16-bit parameters: half the fp32 run's buffers."""
    from anatomy import strategies
    from anatomy.prediction import predict, predict_ranks
    from anatomy.prediction.memory import _recording
    from anatomy.prediction.step import TracedRun

    options = RunOptions(model="tiny-llama", batch_size=2, seq_len=16, processes=world,
                         strategy="fsdp")
    rank = predict_ranks(options, device="cpu")
    alone = predict(options, device="cpu")
    assert alone.weights <= world * rank.weights < alone.weights + world * 64 * 1024
    assert world * rank.gradients == world * rank.weights  # fp32 gradients of fp32 shards
    assert rank.optimizer_states == 2 * rank.weights  # AdamW's two moments, sharded
    assert rank.peak < alone.peak and rank.as_prediction().peak == rank.peak
    gathered = {precision: _gathered_most(_recording(
        TracedRun.of(replace(options, precision=precision)), "cpu", None, 1,
        rank=strategies.named("fsdp").recording_key(world)))
        for precision in ("fp32", "bf16")}
    assert gathered["bf16"] * 2 == gathered["fp32"] > 0


def test_a_batch_too_large_for_the_gpu_is_warned():
    """The Live form's warning names the largest batch size that fits, the one What fits? finds
    (two searches on bert-large: seconds)."""
    forecast = memory_forecast(validated({"model": "bert-large-uncased", "batch_size": 256}, 1),
                               H200_MACHINE)
    assert forecast.warning.startswith("Does not fit GPU 0's 140.0 GiB: its tensors decide")
    largest = batch_size_forecast(validated({"model": "bert-large-uncased"}, 1),
                                  H200_MACHINE).line
    assert forecast.warning.endswith(f"; the largest batch size that fits: "
                                     f"{largest.split(': ')[1].split(' ')[0]}")

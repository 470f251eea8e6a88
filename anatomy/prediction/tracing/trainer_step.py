"""The Trainer's training step, as its memory sees it: the same model, the same optimizer with the
same parameter groups, the same autocast and the same order of frees, without the Trainer's
dataloader, logging and callbacks (which hold only a few scalars).

What it mirrors (transformers 5.23, accelerate 1.15):
- `Trainer.__init__`: `model.config.use_cache = args.use_cache` (False: no key-value cache);
- `Trainer._prepare_for_training`: activation checkpointing through the model's own
  `activation_checkpointing_enable()` (non-reentrant; input gradients for text models);
- `Trainer.create_optimizer`: two parameter groups (weight decay / none, by
  `get_decay_parameter_names`), the class and arguments `get_optimizer_cls_and_kwargs` picks;
- `Trainer.get_batch_samples`: the step's micro-batches on the device before the first one runs,
  and `num_items_in_batch` when the model takes loss keyword arguments;
- `Trainer.training_step`: the forward pass under accelerate's wrapper (autocast, then the
  outputs converted to fp32), the model's outputs dropped before the backward pass, the loss
  divided for accumulation, `accelerator.backward` (the fp16 loss scaler's scaling);
- `Trainer.compute_loss` with `label_smoothing_factor`: the labels popped from the batch, the
  model's forward pass without them, `LabelSmoother` on its fp32 logits (shifted for a causal
  LM, as the Trainer tells one by its class);
- the optimizer step: the scaler's unscaling (fp16), `clip_grad_norm_(max_norm=1.0)`,
  `optimizer.step()`, `model.zero_grad()` (gradients set to None).

The same code runs on real tensors (the tests measure a real CPU step with it) and on fake ones
(the prediction). `kernels` says which device's kernels the fake tensors stand for; the CUDA ones
that differ are prediction/tracing/cuda.py's.
"""

from __future__ import annotations

import inspect
import tempfile
from collections.abc import Callable
from contextlib import nullcontext

# transformers' modules at import, before any trace: importing them makes module-level tensors
# (peft's, which trainer_utils imports) that a trace would record in a process's first recording
# only. Not transformers.trainer: it loads datasets and pandas, a second of a cold `predict`.
import torch
from accelerate.utils.operations import convert_to_fp32
from transformers import TrainingArguments
from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.trainer_optimizer import (
    _OPTIMIZER_HANDLERS,
    OptimizerContext,
    _parse_optim_args,
)
from transformers.trainer_pt_utils import LabelSmoother, get_parameter_names
from transformers.trainer_utils import unwrap_peft_model

from anatomy.analysis import dummy_data
from anatomy.analysis.lengths import TextBatch
from anatomy.analysis.models import CAUSAL_LM, ModelError, ModelSpec
from anatomy.prediction.step import StepOptions
from anatomy.vocabulary import Precision

MAX_GRAD_NORM = 1.0  # TrainingArguments' default
AUTOCAST_DTYPES = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}
FP16_INIT_SCALE = 2.0**16  # torch.amp.GradScaler's default


def enable_checkpointing(model, context_fn: Callable | None = None) -> None:
    """As `Trainer._prepare_for_training` does it (every layer, not offloaded, non-reentrant).
    `context_fn` (torch.utils.checkpoint's) only wraps the recomputation in the trace's modes."""
    kwargs = None if context_fn is None else {"use_reentrant": False, "context_fn": context_fn}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs,
                                              every_n_layers=1, offload=False)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def training_arguments(optim: str) -> TrainingArguments:
    """TrainingArguments as far as the optimizer's class and arguments depend on them."""
    return TrainingArguments(output_dir=tempfile.gettempdir(), optim=optim, use_cpu=True,
                             report_to="none")


# Trainer.get_decay_parameter_names' patterns: no weight decay for biases and normalisations.
NO_DECAY_PATTERNS = (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")


def decay_parameter_names(model) -> list[str]:
    """`Trainer.get_decay_parameter_names`, without transformers.trainer (held equal in
    tests/unit/test_prediction.py)."""
    return get_parameter_names(model, [torch.nn.LayerNorm], list(NO_DECAY_PATTERNS))


def optimizer_class_and_kwargs(args, model) -> tuple[type, dict]:
    """`Trainer.get_optimizer_cls_and_kwargs`, from the module that holds the Trainer's optimizers
    (held equal for every optimizer the options offer)."""
    handler = _OPTIMIZER_HANDLERS.get(args.optim)
    if handler is None:
        raise ValueError(f"unsupported optimizer: {args.optim}")
    return handler(OptimizerContext(
        args=args, model=model, optimizer_kwargs={"lr": args.learning_rate},
        adam_kwargs={"betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon},
        optim_args=_parse_optim_args(args.optim_args)))


def make_optimizer(model, optim: str, foreach: bool | None = None) -> torch.optim.Optimizer:
    """The Trainer's optimizer: its parameter groups, class and arguments. `foreach=True` forces
    torch's multi-tensor kernels, which torch picks by itself for CUDA tensors only."""
    decay = set(decay_parameter_names(model))
    groups = [
        {"params": [p for n, p in model.named_parameters() if n in decay and p.requires_grad],
         "weight_decay": 0.0},  # TrainingArguments' default weight decay
        {"params": [p for n, p in model.named_parameters() if n not in decay and p.requires_grad],
         "weight_decay": 0.0},
    ]
    cls, kwargs = optimizer_class_and_kwargs(training_arguments(optim), model)
    kwargs = dict(kwargs)
    if foreach and not kwargs.get("fused") and "foreach" in inspect.signature(cls).parameters:
        kwargs["foreach"] = True
    return cls(groups, **kwargs)


def accepts_loss_kwargs(model) -> bool:
    """Trainer.__init__'s test, on the model under peft's wrapper: the model says so, or its
    forward takes **kwargs."""
    model = unwrap_peft_model(model)
    if hasattr(model, "accepts_loss_kwargs"):
        return bool(model.accepts_loss_kwargs)
    return any(p.kind == inspect.Parameter.VAR_KEYWORD
               for p in inspect.signature(model.forward).parameters.values())


def make_batch(spec: ModelSpec, batch_size: int, seq_len: int, device: str = "cpu",
               target_len: int = 0) -> dict:
    """One micro-batch as the collator hands it to the model: separate tensors, laid out as
    analysis/dummy_data.py lays a sample out (a causal LM's labels are a copy of its input ids,
    as collated from the dataset's two columns; a sequence-to-sequence model's decoder inputs are
    its labels shifted right behind the start token, as DataCollatorForSeq2Seq makes them).
    engine/dataset.py makes the same items."""
    sample = dummy_data.sample(spec, seq_len, target_len)
    batch: dict = {}
    for name, tensor in sample.tensors:
        batch[name] = _filled(tensor, sample, batch, batch_size, device)
    return batch


def padded_batch(spec: ModelSpec, text: TextBatch, device: str = "cpu") -> dict:
    """A dataset's micro-batch as transformers' collators pad it (engine/dataset.py's
    `TextDataset`): token ids padded to `text.padded_to`, the attention mask 1 over each
    sequence's own tokens, the other inputs the tokenizer gives (token_type_ids: 0 for one
    text), and the labels — a causal LM's its ids with -100 over the padding, as
    DataCollatorForLanguageModeling makes them; a classifier's laid out as the dummy data's."""
    sample = dummy_data.sample(spec, text.padded_to)
    shape = (text.size, text.padded_to)
    positions = torch.arange(text.padded_to, device=device)
    left = text.padding_side == "left"
    kept = torch.stack([positions >= text.padded_to - n if left else positions < n
                        for n in text.lengths])
    batch = {"input_ids": torch.randint(sample.low, sample.high, shape, device=device)}
    for name in text.inputs:
        batch[name] = kept.long() if name == "attention_mask" else \
            torch.zeros(shape, dtype=torch.long, device=device)
    if spec.task == CAUSAL_LM:
        batch["labels"] = batch["input_ids"].masked_fill(~kept, -100)
    else:
        labels = dict(sample.tensors)["labels"]
        batch["labels"] = _filled(labels, sample, batch, text.size, device)
    return batch


def _filled(tensor: dummy_data.Tensor, sample: dummy_data.Sample, made: dict, batch_size: int,
            device: str) -> torch.Tensor:
    shape = (batch_size, *tensor.shape)
    if tensor.fill == dummy_data.TOKENS:
        low, high = tensor.tokens or (sample.low, sample.high)
        ids = torch.randint(low, high, shape, device=device)
        if tensor.last is not None:
            ids[..., -1] = tensor.last
        return ids
    if tensor.fill == dummy_data.NOISE:
        return torch.randn(shape, device=device)
    if tensor.fill == dummy_data.ONES:
        return torch.ones(shape, dtype=torch.long, device=device)
    if tensor.fill == dummy_data.VALUES:
        return torch.tensor(tensor.values, device=device).expand(shape).clone()
    if tensor.fill == dummy_data.CLASS:
        return torch.randint(0, sample.num_labels, shape, device=device)
    if tensor.fill == dummy_data.MULTI_HOT:
        return torch.randint(0, 2, shape, dtype=torch.float32, device=device)
    source = made[tensor.source]
    if tensor.fill == dummy_data.COPY:
        return source.transpose(1, 2).contiguous() if tensor.transpose else source.clone()
    start = torch.full((batch_size, 1), sample.start_token, dtype=source.dtype,  # SHIFTED
                       device=device)
    return torch.cat([start, source[:, :-1]], dim=1)


def loss_shifts_labels(model) -> bool:
    """`Trainer.__init__`'s test: a causal LM's loss shifts its labels (an encoder-decoder's
    decoder inputs are shifted instead)."""
    inner = unwrap_peft_model(model)
    return LOSS_MAPPING.get(getattr(inner, "loss_type", None)) is ForCausalLMLoss and \
        not getattr(inner.config, "is_encoder_decoder", False)


def label_smoother(model, factor: float) -> tuple[LabelSmoother, bool] | None:
    """`Trainer.__init__`'s LabelSmoother for `factor` (None without one, or for a multi-label
    classifier, for which the Trainer drops it), and whether it shifts the labels:
    `Trainer.compute_loss` shifts them for a model whose class is a causal LM's."""
    inner = unwrap_peft_model(model)
    config = getattr(inner, "config", None)
    if not factor or getattr(config, "problem_type", None) == "multi_label_classification":
        return None
    causal = type(inner).__name__ in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
    return LabelSmoother(epsilon=factor), causal


def items_in_batch(batches: list[dict], shifts: bool):
    """`Trainer._get_num_items_in_batch`: labels that count (shifted by one where the loss
    shifts them), divided by the devices sharing the batch (tensor, context and sequence
    parallelism: 1 here), which makes the count a float tensor (the loss saves it)."""
    labels = [b["labels"][..., 1:] if shifts else b["labels"] for b in batches]
    return sum(label.ne(-100).sum() for label in labels) / 1


class LossScaler:
    """torch.amp.GradScaler's memory for fp16: two scalars on the device, the scaled loss, and
    an in-place unscaling of the gradients. (The real scaler turns itself off where CUDA is not
    available, which is where the fake CUDA step runs.)"""

    def __init__(self, device: str = "cpu"):
        self.scale = torch.full((), FP16_INIT_SCALE, dtype=torch.float32, device=device)
        self.growth_tracker = torch.full((), 0, dtype=torch.int32, device=device)

    def scaled(self, loss):
        return loss * self.scale

    def unscale_(self, optimizer) -> None:
        inv_scale = self.scale.double().reciprocal().float()
        found_inf = torch.full((), 0.0, dtype=torch.float32, device=self.scale.device)
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]
                 if p.grad is not None]
        torch._foreach_mul_(grads, inv_scale)
        del found_inf


class TrainerStep:
    """One model set up as the Trainer sets it up, and its step in parts (so a trace can tell
    them apart): `micro_batch` (forward + backward) and `optimizer_step`.

    `autocast` makes the forward pass's autocast context (torch.autocast on `device` unless
    given); `on_mark(label)` is told the moments the probe reads; `checkpoint_context` is
    activation checkpointing's context_fn (the CUDA emulation's, for the recomputation);
    `prepare(model)` wraps the model for several processes (FSDP) before the optimizer is made."""

    def __init__(self, model, spec: ModelSpec, options: StepOptions, *, device: str = "cpu",
                 foreach: bool | None = None, autocast: Callable | None = None,
                 on_mark: Callable[[str], None] | None = None,
                 checkpoint_context: Callable | None = None,
                 prepare: Callable | None = None):
        self.model, self.spec, self.options, self.device = model, spec, options, device
        self.on_mark = on_mark or (lambda label: None)
        if getattr(model, "config", None) is not None:  # Trainer.__init__: TrainingArguments'
            model.config.use_cache = False  # use_cache, False: no key-value cache in training
        if options.gradient_checkpointing:
            enable_checkpointing(model, checkpoint_context)
        model.train()
        if prepare is not None:  # accelerate's prepare: FSDP shards the model before the
            prepare(model)  # Trainer makes its optimizer (tracing/fsdp.py)
        dtype = AUTOCAST_DTYPES.get(options.precision)
        if dtype is None:
            self.autocast = nullcontext
        elif autocast is not None:
            self.autocast = lambda: autocast(dtype)
        else:
            self.autocast = lambda: torch.autocast(device, dtype=dtype)
        self.optimizer = make_optimizer(model, options.optim, foreach)
        self.foreach = foreach
        self.loss_kwargs = accepts_loss_kwargs(model)
        self.shifts_labels = loss_shifts_labels(model)
        self.smoother = label_smoother(model, options.label_smoothing)
        self.scaler = LossScaler(device) if options.precision == Precision.FP16 else None

    def batches(self) -> tuple[list[dict], object]:
        """The step's micro-batches and their item count, fetched before the first one runs."""
        o = self.options
        batches = [make_batch(self.spec, o.batch_size, o.seq_len, self.device, o.target_len)
                   if o.text is None
                   else padded_batch(self.spec, o.text, self.device) for _ in range(o.grad_accum)]
        items = items_in_batch(batches, self.shifts_labels) if self.loss_kwargs else None
        return batches, items

    def _loss(self, inputs: dict, items) -> torch.Tensor:
        kwargs = {"num_items_in_batch": items} if self.loss_kwargs and items is not None else {}
        # The Trainer's smoother takes the labels out of the batch (it holds them no more)
        labels = inputs.pop("labels", None) if self.smoother is not None else None
        self.on_mark("forward begins")
        with self.autocast():
            outputs = self.model(**inputs, **kwargs)
        if self.options.precision != Precision.FP32:
            outputs = convert_to_fp32(outputs)  # accelerate's wrapper around the forward pass
        self.on_mark("forward ends")  # the model's forward pass: the smoother's loss is after it
        if labels is not None:
            smoother, shifts = self.smoother
            return smoother(outputs, labels, shift_labels=shifts, num_items_in_batch=items)
        if outputs.get("loss") is None:  # the Trainer refuses it too, after the forward pass
            raise ModelError(f"model: {self.spec.display_name}: "
                             f"{type(unwrap_peft_model(self.model)).__name__} returns no loss "
                             f"for its labels (only {', '.join(outputs)}), and the Trainer "
                             "trains on one")
        return outputs["loss"]  # the outputs go with this frame, before the backward pass

    def micro_batch(self, inputs: dict, items) -> None:
        loss = self._loss(inputs, items)
        if not (self.loss_kwargs and items is not None):
            loss = loss / self.options.grad_accum
        if self.scaler is not None:
            loss = self.scaler.scaled(loss)
        loss.backward()
        del loss
        self.on_mark("backward ends")

    def optimizer_step(self) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(parameters, MAX_GRAD_NORM, foreach=self.foreach)
        del parameters
        self.on_mark("before optimizer step")
        self.optimizer.step()
        self.on_mark("after optimizer step")
        self.model.zero_grad(set_to_none=True)
        self.on_mark("gradients freed")

    def run(self, steps: int, on_step: Callable[[int], None] | None = None) -> None:
        """Whole steps, as the Trainer runs them (the tests' real reference); `on_step(n)` is
        told each step's number as it begins."""
        batches = None
        for number in range(1, steps + 1):
            if on_step is not None:
                on_step(number)
            previous = batches  # the Trainer's list of the last step's batches goes when the
            batches, items = self.batches()  # next one is fetched
            del previous
            for inputs in batches:
                self.micro_batch(inputs, items)
            self.optimizer_step()

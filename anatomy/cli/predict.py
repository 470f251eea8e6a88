"""`anatomy predict`: the memory a run should need, by component, before it runs."""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import sys

from anatomy import prediction
from anatomy.analysis import data, dummy_data, models
from anatomy.analysis.data import Tokenized
from anatomy.analysis.lengths import MAX_LENGTH, Lengths, TextBatch
from anatomy.analysis.options import (
    InvalidOptions,
    RunOptions,
    check,
    lora_words,
    option_words,
)
from anatomy.cli.arguments import add_run_options, values_from_args
from anatomy.cli.render import SaidMeasurer, refused, table
from anatomy.engine.locks import gpu_key
from anatomy.engine.manager import machine
from anatomy.prediction import Answer, Request, answer, device_constants, target
from anatomy.prediction.batches import DataPrediction
from anatomy.prediction.workspaces import WorkspaceError
from anatomy.store import TrainingData
from anatomy.units import MIB, MIB_NAME, in_mib, size_text


def register(commands: argparse._SubParsersAction) -> None:
    predict = commands.add_parser("predict", help="the memory a run should need, by component")
    add_run_options(predict, predicting=True)
    predict.add_argument("--json", action="store_true", help="bytes, as one JSON object")
    predict.add_argument("--max-batch-size", action="store_true",
                         help="the largest batch size predicted to fit the device, instead")
    predict.add_argument("--measure-convolutions", action="store_true",
                         help="on the machine whose GPU the run will use: measure cuDNN's "
                              "convolution workspaces on it (at the batch size, or with "
                              "--max-batch-size at each size the search asks about near the "
                              "edge; a minute at most, with the GPU idle) instead of a band for "
                              "them (a margin, for --max-batch-size)")
    predict.add_argument("--device", choices=prediction.DEVICES,
                         help="the kernels and allocator to assume (default: this machine's)")
    predict.add_argument("--gpu-model", metavar="NAME",
                         help="the GPU whose calibrated constants to use, by its name or its "
                              "last word, in any case (calibrated: "
                              f"{', '.join(device_constants.calibrated())}; default: this "
                              "machine's GPU); implies --device cuda")
    predict.set_defaults(func=cmd_predict)


def cmd_predict(args: argparse.Namespace) -> int:
    # At exit, what is left is frozen: the interpreter's last collections skip it (torch's and
    # transformers' objects: a second of CPU); the memory goes with the process, a prediction
    # holds no store or child, and Python does not promise finalizers at exit anyway.
    atexit.unregister(gc.freeze)  # once per process, however often the command runs
    atexit.register(gc.freeze)
    if args.gpu_model is not None:
        named = device_constants.calibrated_name(args.gpu_model)
        if named is None:
            print(f"error: --gpu-model: {args.gpu_model!r} has no calibrated constants; "
                  f"calibrated: {', '.join(repr(n) for n in device_constants.calibrated())}",
                  file=sys.stderr)
            return 2
        args.gpu_model = named
    if args.gpu_model is not None and args.device == "cpu":
        print(f"error: --gpu-model {args.gpu_model!r} names a GPU, and --device cpu predicts for "
              "this machine's RAM: leave one out", file=sys.stderr)
        return 2
    info = machine()
    try:
        options = RunOptions.read(values_from_args(args, info.gpu_count > 0))
        aimed = target(info, args.gpu or 0, device=args.device, gpu_model=args.gpu_model)
        device, gpu_name, total = aimed.device, aimed.gpu_name, aimed.total
        # A prediction for another machine's GPU is judged as that GPU would judge it.
        # Several GPUs (--gpus 0,1) are judged as a machine with that many would judge them.
        gpus = max(info.gpu_count, (options.world_size if options.gpus else 1)
                   if device == "cuda" else 0)
        # The prediction builds the config class itself and refuses it in the same line
        # (models.transformers_config): no child interpreter to check it first.
        errors = check(options, gpus, here=info.has_gpu or device == "cpu", config_class=False)
        if errors:
            raise InvalidOptions(errors)
    except InvalidOptions as error:
        return refused(error)
    if args.max_batch_size and options.distributed:
        # The search replays one process alone: a rank of several holds more (DDP's gradient
        # buckets) or less (FSDP's shards), and CPU ranks share one RAM.
        n = options.world_size
        print(f"error: --max-batch-size answers for one process alone, not for {n} "
              f"({options.strategy}): leave --processes/--gpus out for its answer, or "
              f"--max-batch-size out for what each of the {n} needs at this batch size",
              file=sys.stderr)
        return 2
    if args.max_batch_size and options.on_dataset:
        print("error: --max-batch-size searches the dummy data's batches of one length; a "
              "dataset's batch sizes each form their own longest batch: give --batch-size B for "
              "the longest batch of B texts", file=sys.stderr)
        return 2
    if args.measure_convolutions:
        refusal = _measuring_refusal(args, info, device, gpu_name)
        if refusal:
            print(f"error: --measure-convolutions: {refusal}", file=sys.stderr)
            return 2
    try:
        if args.max_batch_size:
            measure_on = info.devices[args.gpu or 0] if args.measure_convolutions else None
            return _print_batch_fit(answer(Request(options, aimed)), args.json, measure_on)
        options, texts = data.prepared(options)
        measured = (_measured_workspaces(options, gpu_name, info.devices[args.gpu or 0])
                    if args.measure_convolutions else None)
        said = answer(Request(options, aimed, texts.facts if texts is not None else None,
                              measured))
        found, predicted, ranks = said.data, said.alone, said.ranks
        # One process on its device: whether it fits and which limit decides (a rank's own peak
        # is in the ranks' line); a dataset's at its longest batch.
        verdict = said.verdict
    except (prediction.PredictionError, WorkspaceError, data.DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        out = predicted.to_dict()
        if ranks is not None:  # each rank's, beside the single process's
            out["ranks"] = ranks.to_dict()
        if found is not None:
            out["dataset"] = _data_json(texts, found)
        if verdict is not None:
            out["fit"] = verdict.to_dict()
        print(json.dumps(out, indent=2))
        return 0
    print(_run_words(options, predicted))
    if found is not None:
        _print_data(texts, found)
    if ranks is not None:
        print(ranks.line())
        print("  " + in_mib("per rank") + ": " + ", ".join(
            f"{name.replace('_', ' ')} {value / MIB:,.1f}"
            for name, value in ranks.components().items() if value))
    if device == "cuda":
        print(f"kernels and constants: {predicted.gpu}"
              f"{'' if predicted.calibrated else ' (not calibrated: docs/MEASUREMENTS.md figures)'}"
              f"; attention: {', '.join(sorted(set(predicted.attention_kernels))) or 'none'}")
    rows = [[name.replace("_", " "), f"{value / MIB:,.1f}",
             f"{value / predicted.parameters:.2f}"] for name, value in predicted.components().items()]
    rows.append(["sum of the parts", f"{predicted.sum_of_parts / MIB:,.1f}", ""])
    if device == "cuda":
        rows += [["allocator reserve (peak)", f"{predicted.peak_reserved / MIB:,.1f}", ""],
                 ["CUDA context", f"{predicted.context / MIB:,.1f}", ""],
                 ["outside PyTorch", f"{predicted.outside / MIB:,.1f}", ""],
                 ["NVML peak", f"{predicted.nvml_peak / MIB:,.1f}", ""]]
        if predicted.nvml_high is not None:  # cuDNN's workspaces, not traced: a band
            rows.append(["NVML peak, up to", f"{predicted.nvml_high / MIB:,.1f}", ""])
    # Several processes: the table is the one process's the ranks' line compares with.
    print(table(rows, ["component" if ranks is None else "one process alone", MIB_NAME,
                       "bytes/param"]))
    print((ranks or predicted).need_line())
    if found is not None:
        print(_typical_line(found))
    if verdict is not None:
        print(verdict.line(_device_words(device, gpu_name, total)))
    return 0


def _print_data(texts: Tokenized, found: DataPrediction) -> None:
    """A dataset's texts and the batches the run is predicted at."""
    facts, batches = texts.facts, found.batches
    cut = f", cut at {facts.max_length:,} tokens" if facts.max_length else ""
    print(f"dataset: {facts.dataset} ({facts.split}, column {facts.text_column}), tokenized by "
          f"{facts.tokenizer}{cut}")
    print(f"  {batches.lengths.words()}")
    print(f"  longest batch: {_batch_words(batches.longest, batches.lengths, facts)}")
    print(f"  typical batch: {batches.typical.words()} (the median over a shuffled epoch's "
          "batches of their longest text)")
    print("the table is the longest batch's: the run's peak")


def _batch_words(batch: TextBatch, lengths: Lengths, facts: TrainingData) -> str:
    which = (f"its {batch.size} longest texts" if batch.lengths == lengths.top(batch.size) else
             f"its {batch.size - 1} longest texts and the longest shorter one: with padding, so "
             "that the model holds its attention mask")
    padded = "to max_length" if facts.padding == MAX_LENGTH else "to the longest"
    return (f"{batch.words()} ({which}, padded {padded}; the Trainer shuffles, so any batch may "
            "hold the longest text)")


def _typical_line(found: DataPrediction) -> str:
    typical = found.typical
    nvml = f", {size_text(typical.nvml_peak)} as nvidia-smi counts it" \
        if typical.nvml_peak is not None else ""
    return (f"a typical batch ({found.batches.typical.words()}) should need about "
            f"{size_text(typical.peak)} for tensors{nvml}")


def _data_json(texts: Tokenized, found: DataPrediction) -> dict:
    batches = found.batches
    return {**texts.facts.to_dict(), "texts": batches.lengths.texts,
            "tokens": batches.lengths.tokens, "quantiles": batches.lengths.quantiles(),
            "longest_batch": list(batches.longest.lengths),
            "longest_padded_to": batches.longest.padded_to,
            "typical_batch": list(batches.typical.lengths),
            "typical_padded_to": batches.typical.padded_to,
            "typical": found.typical.to_dict()}


def _measured_workspaces(options: RunOptions, gpu_name: str | None, gpu):
    """The run's recording with its convolutions' workspaces measured on this machine's GPU
    (analysis.machine.Device, checked by _measuring_refusal) at its batch size, holding the
    GPU's device lock while it measures; None (said) where it has no convolution."""
    measure = SaidMeasurer(gpu.index, gpu_key(gpu.nvml_index))
    try:
        measured = prediction.measured_recording(options, device_constants.load(gpu_name),
                                                 measure)
    finally:
        measure.close()
    if measured is None:
        print("the run has no convolutions: no workspace to measure", file=sys.stderr)
    return measured


def _device_words(device: str, gpu_name: str | None, total: int) -> str:
    return (f"{gpu_name} ({size_text(total)})" if device == "cuda"
            else f"this machine's RAM ({size_text(total)})")


def _run_words(options: RunOptions, predicted) -> str:
    spec = models.resolve(options.model)
    shape = "the dataset's texts" if options.on_dataset else \
        dummy_data.sample(spec, options.seq_len, options.target_len).words
    lora = (f", {lora_words(options)} ({predicted.trainable_parameters:,} trainable)"
            if options.lora else "")
    quantized = models.quantization_left_out(spec.config)
    return (f"{spec.display_name} ({predicted.parameters:,} parameters, {spec.task}), batch size "
            f"{options.batch_size}, {shape}, {option_words(options)}, "
            f"{options.optim}"
            f"{', gradient checkpointing' if options.gradient_checkpointing else ''}"
            f"{f', accumulation {options.grad_accum}' if options.grad_accum > 1 else ''}{lora}"
            f"{f'; {quantized}' if quantized else ''}")


def _measuring_refusal(args: argparse.Namespace, info, device: str, gpu_name: str | None
                       ) -> str | None:
    """Why this machine's GPU cannot measure the workspaces the prediction asks about."""
    if device != "cuda" or not info.has_gpu:
        return "it measures this machine's GPU, and there is none here"
    gpu = info.devices[args.gpu or 0] if (args.gpu or 0) < info.gpu_count else None
    if gpu is None or gpu.name != gpu_name:
        here = gpu.name if gpu else "none"
        return (f"it measures this machine's GPU ({here!r}), not {gpu_name!r}: leave "
                "--gpu-model out, or run it where that GPU is")
    return None


def _print_batch_fit(said: Answer, as_json: bool, measure_on=None) -> int:
    """`measure_on`: this machine's GPU (analysis.machine.Device, checked by _measuring_refusal)
    to measure the convolutions on, holding its device lock while it measures."""
    aimed = said.request.target
    device, gpu_name, total = aimed.device, aimed.gpu_name, aimed.total
    measure = None if measure_on is None else \
        SaidMeasurer(measure_on.index, gpu_key(measure_on.nvml_index))
    try:
        fit = said.largest_batch(measure)
    finally:
        if measure is not None:
            measure.close()
    if measure is not None and not fit.workspaces_measured:
        print("the run has no convolutions: no workspace to measure", file=sys.stderr)
    where = _device_words(device, gpu_name, total)
    if as_json:
        print(json.dumps({"max_batch_size": fit.batch_size, "capacity": fit.capacity,
                          "peak": fit.peak_at_fit, "may_fit": fit.may_fit,
                          "peak_at_may_fit": fit.peak_at_may_fit, "at_limit": fit.at_limit,
                          "limit": fit.limit, "device": device, "gpu": gpu_name,
                          "total": total, "tried": list(fit.searched),
                          "linear": not fit.exact, "convolutions": fit.convolutions,
                          "workspaces_measured": fit.workspaces_measured,
                          "decided_by": None if fit.decided_by is None else str(fit.decided_by),
                          "peak_beyond": fit.peak_beyond},
                         indent=2))
    else:
        print(fit.line(where))
    return 0 if fit.batch_size is not None else 1

"""FSDP (full shard, FSDP2 as accelerate drives it): each process holds a shard of the
parameters, gradients and optimizer states, and gathers a layer's parameters whole for its
forward and backward passes. The Trainer builds accelerate's FSDP plugin from its arguments;
a rank's memory is traced (prediction/tracing/fsdp.py), its collectives' buffers
named as torch makes them."""

from __future__ import annotations

from typing import Any

from anatomy.strategies.base import Strategy

# A rank prediction's names for the buffers of FSDP's collectives alive at its peak: the
# all-gathers' outputs and the unsharded parameters copied out of them (in the mixed
# precision's dtype), and the reduce-scatters' inputs (unsharded gradients) and outputs.
ALL_GATHER = "fsdp_all_gather"
REDUCE_SCATTER = "fsdp_reduce_scatter"


class Fsdp(Strategy):
    name = "fsdp"
    label = "FSDP"
    summary = "parameters, gradients, optimizer states sharded; GPUs only"
    communication = "FSDP's all-gather and reduce-scatter buffers"
    buffers = (ALL_GATHER, REDUCE_SCATTER)
    tracer = "fsdp"

    def problems(self, world: int, gpu_count: int, here: bool) -> str | None:
        # No GPU here first: "give --gpus 0,1" sent a user of a machine without one (or of
        # the form, which offers no GPUs there) after GPUs it does not have.
        if gpu_count == 0 and here:
            return ("strategy: fsdp needs GPUs: accelerate's FSDP runs on GPU ranks only (CPU "
                    "ranks train with ddp)")
        if world < 2:
            return "strategy: fsdp shards across several processes: give --gpus 0,1"
        return None

    def training_arguments(self, model: Any = None) -> dict[str, Any]:
        """Full sharding through accelerate's FSDP plugin, each transformer layer its own unit."""
        from transformers import TrainingArguments

        # transformers >= 5.20 takes fsdp=True and everything in fsdp_config; before, the string.
        new_api = "const" in TrainingArguments.__dataclass_fields__["fsdp"].metadata
        layers = unit_classes(model) if model is not None else []
        return {"fsdp": True if new_api else "full_shard auto_wrap",
                "fsdp_config": {"auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                **({"transformer_layer_cls_to_wrap": layers} if layers else {}),
                                **({"reshard_after_forward": True} if new_api else {})}}


def unit_classes(model) -> list[str]:
    """The classes FSDP makes its units of: the model's own `_no_split_modules` (transformers'
    names for its layers) less any that holds the input embeddings. accelerate (1.15) shards the
    input embeddings as a unit of their own after the layers, and a module already inside a unit
    fails there (BERT lists BertEmbeddings: "value was None when it should not be", seen on two
    H200s with torch 2.11). The worker's fsdp_config and the prediction's trace both use it."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    keep = set()
    for module in model.modules():
        name = type(module).__name__
        if name in names and not any(inner is embeddings for inner in module.modules()):
            keep.add(name)
    return sorted(keep)


STRATEGY = Fsdp()

"""Measured memory components of a training run: where the training phase's memory goes.

The worker attaches a `ComponentProbe` to the model and the Trainer's callbacks; over the first
steps it reads tensor sizes and the caching allocator at the moments that matter:

- weights: bytes of the parameters;
- gradients: bytes of the `.grad` tensors just before the first optimizer step;
- optimizer_states: bytes of the optimizer's state tensors just after it;
- activations: memory held between the end of the forward pass and the start of the backward
  pass (the allocator's growth over the forward pass on a GPU; on a CPU, where torch keeps no
  allocator statistics, the unique storages autograd saved for the backward pass);
- temporary: what the allocator's peak holds beyond the components that can be alive together
  (`rest_of_peak`: workspaces, the optimizer's scratch, transient buffers of the backward pass);
- allocator_cache: memory the caching allocator reserved but did not hand out at its peak;
- peak_allocated / peak_reserved: the allocator's own peaks.

The CUDA context and the non-PyTorch rest come from the NVML samples (`with_nvml`).
Importing this module imports no torch: the CLI and the pages read stored components.
"""

from __future__ import annotations

MEASURED_STEPS = 3  # step 1 creates the optimizer's states; steps 2-3 are the steady state
ORDER = ("context", "weights", "gradients", "optimizer_states", "activations", "temporary",
         "allocator_cache", "non_torch", "peak")


def _tensor_bytes(tensors) -> int:
    """Bytes of distinct storages: views and shared weights are counted once."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def optimizer_state_bytes(optimizer) -> int:
    import torch

    return _tensor_bytes(value for state in optimizer.state.values() for value in state.values()
                         if isinstance(value, torch.Tensor) and value.numel() > 1)


class ComponentProbe:
    """Hooks on the model plus callback entry points; `result()` gives bytes by component."""

    def __init__(self, model, use_cuda: bool):
        import torch

        self.torch, self.model, self.use_cuda = torch, model, use_cuda
        self.values: dict[str, int] = {"weights": _tensor_bytes(model.parameters())}
        self.moments: dict[str, int] = {}
        self.forwards = 0
        self._before = 0
        self._saved: dict[int, int] = {}
        self._saving = None
        self._handles = [model.register_forward_pre_hook(self._forward_begins),
                         model.register_forward_hook(self._forward_ends)]
        if use_cuda:
            torch.cuda.reset_peak_memory_stats()

    def _allocated(self) -> int:
        return self.torch.cuda.memory_allocated() if self.use_cuda else 0

    def _forward_begins(self, module, args):
        if not module.training:
            return
        self._before = self._allocated()
        if not self.use_cuda:
            self._saved = {}

            def pack(tensor):
                storage = tensor.untyped_storage()
                self._saved[storage.data_ptr()] = storage.nbytes()
                return tensor

            self._saving = self.torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
            self._saving.__enter__()

    def _forward_ends(self, module, args, output):
        if not module.training:
            return
        self.forwards += 1
        if self.use_cuda:
            held = self._allocated() - self._before
            self.moments["end of forward"] = self._allocated()
        else:
            self._saving.__exit__(None, None, None)
            self._saving = None
            parameters = {p.untyped_storage().data_ptr() for p in self.model.parameters()}
            held = sum(size for ptr, size in self._saved.items() if ptr not in parameters)
        # The latest forward pass, not the largest: the first one also allocates cuBLAS's
        # workspace (32 MiB on Hopper), which is not an activation and stays for good.
        self.values["activations"] = held

    def before_optimizer_step(self) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        self.values["gradients"] = max(self.values.get("gradients", 0), _tensor_bytes(grads))
        if self.use_cuda:
            self.moments["end of backward"] = max(self.moments.get("end of backward", 0),
                                                  self._allocated())

    def after_optimizer_step(self, optimizer) -> None:
        if optimizer is not None:
            self.values["optimizer_states"] = optimizer_state_bytes(optimizer)
        if self.use_cuda:
            self.moments["after optimizer step"] = max(
                self.moments.get("after optimizer step", 0), self._allocated())

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._saving is not None:
            self._saving.__exit__(None, None, None)
            self._saving = None

    def result(self) -> dict[str, int]:
        values = dict(self.values)
        if self.use_cuda:
            cuda = self.torch.cuda
            peak_allocated, peak_reserved = cuda.max_memory_allocated(), cuda.max_memory_reserved()
            values.update(allocator_cache=peak_reserved - peak_allocated,
                          peak_allocated=peak_allocated, peak_reserved=peak_reserved)
            values["moments"] = dict(self.moments)
        values["steps_measured"] = MEASURED_STEPS
        return values


def rest_of_peak(parts: dict, peak: int) -> int:
    """The peak beyond the components alive at it. Activations and gradients are never all alive
    at once (activations are freed in the backward pass as gradients appear), so the peak holds
    weights + optimizer states + the larger of the two. The same arithmetic serves the measured
    and the predicted side, so the two can be compared."""
    steady = (parts.get("weights", 0) + parts.get("optimizer_states", 0)
              + max(parts.get("activations", 0), parts.get("gradients", 0)))
    return max(0, peak - steady)


def with_nvml(measured: dict, phases: list[dict], peak: int | None, backend: str) -> dict:
    """The measured components completed with what only the samples know: the CUDA context
    (kernel phase − baseline) and, at the training phase's peak, what PyTorch's allocator does
    not hold (lazily loaded kernels, library workspaces outside the allocator)."""
    out = dict(measured)
    if "peak_allocated" in out:  # computed when read, so every stored run uses today's arithmetic
        out["temporary"] = rest_of_peak(out, out["peak_allocated"])
    memory = {p["name"]: p.get("memory_bytes") for p in phases}
    if backend == "nvml" and memory.get("kernel") is not None and memory.get("baseline") is not None:
        out["context"] = memory["kernel"] - memory["baseline"]
        if peak is not None and "peak_reserved" in out:
            out["non_torch"] = max(0, peak - memory["kernel"] - out["peak_reserved"])
    if peak is not None and memory.get("baseline") is not None:
        out["peak"] = peak - memory["baseline"]
    return out

#!/usr/bin/env bash
# Issue 21 on two H200s, in one call of at most 9 minutes (docs/SCALING.md, "What remains"):
# the two-GPU test, then bench/scaling.py --quick (1 GPU, 2 x DDP, 2 x FSDP in bf16, fp32 and
# with checkpointing, for bert-large and a 1.1 B decoder; ZeRO where anatomy offers it), each run
# beside its prediction per rank. Run from the repository root with the wheels of
# /work/shared/gpu/fetch-wheels.sh in .whl/; everything lands in $OUT.
set -u
out=${OUT:-/tmp/anatomy-out}; mkdir -p "$out"
# NVLink multicast off in NCCL, PyTorch and NVSHMEM, here and in every process started from here.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:$PYTHONPATH  # bench/*.py and the tests import anatomy from the checkout
{ nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
  nvidia-smi topo -m
  python3 -c 'import torch, transformers, accelerate; print(torch.__version__, transformers.__version__, accelerate.__version__, torch.cuda.device_count())'
} > "$out/machine.txt" 2>&1
# The two-GPU test, its whole output kept (its last failure was cut to one number).
timeout 150 python3 -m pytest -x -rA --tb=long -p no:cacheprovider \
  "tests/e2e/test_gpu.py::test_two_gpus_through_accelerate_ddp" > "$out/test_two_gpus.txt" 2>&1
echo "two-GPU test: exit $?" | tee -a "$out/machine.txt"
# The scaling set: 10 runs of 10 steps; predictions in processes of their own meanwhile.
timeout 320 python3 bench/scaling.py --quick --run-timeout 90 --out "$out/scaling" \
  > "$out/scaling.log" 2>&1
echo "scaling: exit $?" | tee -a "$out/machine.txt"
python3 bench/scaling.py --report "$out/scaling/scaling.json" 2>&1 | tee "$out/scaling.md"
tail -5 "$out/test_two_gpus.txt"

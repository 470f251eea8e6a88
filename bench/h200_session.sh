#!/usr/bin/env bash
# The GPU machine's measurements behind docs/MEASUREMENTS.md sections 2-4 and docs/BENCHMARKS.md.
# Run from the repository root on a CUDA machine; results go to $OUT (default /tmp/anatomy-out).
set -u
out=${OUT:-/tmp/anatomy-out}; mkdir -p "$out"
export ANATOMY_STORE=$out/h200.sqlite PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # bench/*.py import anatomy from the checkout
python3 bench/sampler_rate.py --seconds 2 --rates 200,1000,2000 > "$out/sampler.jsonl"
# Measured components (first 3 steps) and operation classes, bert-large at batch size 4.
for args in "--precision fp32 --profile-steps 3" "--precision fp32 --gradient-checkpointing" \
            "--precision bf16 --profile-steps 3" "--precision bf16 --gradient-checkpointing"; do
  python3 -m anatomy run --preset bert-large-uncased --batch-size 4 --max-steps 20 $args 2>&1 | tail -4
done
# The largest batch size that fits at sequence length 512.
python3 -m anatomy sweep --preset bert-large-uncased --seq-len 512 --max-steps 3 \
  --vary batch-size=1,2,4,8,16,32,64 --until-oom --json > "$out/sweep.json"
python3 -m anatomy runs
for i in 1 2 3 4; do python3 -m anatomy show $i --json > "$out/show$i.json"; done

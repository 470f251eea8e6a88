# On a GPU, from the repository root (PYTHONPATH=.): `bash bench/edge_out_of_sample.sh`.
# Each configuration at its predicted largest batch size, then the next (it fitted) or the one
# before (it did not): the out-of-sample check of "What fits".
set -u
check() {  # label with B for the batch size, predicted size
  local status
  status=$(timeout 150 python3 bench/peak_snapshot.py --out /tmp/snap7 "${1/B/b$2}" 2>&1 | tail -1)
  echo "$status"
  if [[ $status == *": completed,"* ]]; then next=$(( $2 + 1 )); else next=$(( $2 - 1 )); fi
  timeout 150 python3 bench/peak_snapshot.py --out /tmp/snap7 "${1/B/b$next}" 2>&1 | tail -1
}
check "smollm2-360m bf16 B s512 sgd" 123
check "opus-mt-en-de bf16 B s512 sgd" 253
check "electra-large fp32 B s256 sgd" 348
check "bloom-560m bf16 B s512 adafactor" 55
check "qwen2.5-1.5b bf16 B s512 adamw_torch lora16" 62
check "falcon-rw-1b bf16 B s512 sgd ckpt" 305

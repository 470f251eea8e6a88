# On a GPU, from the repository root (PYTHONPATH=.): `bash bench/convolution_edge.sh OUT`.
# The out-of-sample check of the convolution margin (device_constants.py): convolution networks
# never run at the edge, each at its predicted largest batch size ("sure", predicted on a CPU
# before: docs/data/h200-2026-12-02/convolution-edge-predicted.jsonl), then the next; where the
# next runs too, up to the size that may fit and by bisection between them: the largest that runs.
set -u
out=${1:-/tmp/convedge}
run() {  # label with B for the batch size, the batch size -> 0 when it completed
  local status
  status=$(timeout 170 python3 bench/peak_snapshot.py --out "$out" "${1/B/b$2}" 2>&1 | tail -1)
  echo "$status"
  [[ $status == *": completed,"* ]]
}
check() {  # label, sure, may
  local label=$1 sure=$2 may=$3 low high middle
  run "$label" "$sure" || return 0
  run "$label" $(( sure + 1 )) || return 0
  if run "$label" "$may"; then run "$label" $(( may + 1 )); return 0; fi
  low=$(( sure + 1 )) high=$may
  for _ in 1 2 3; do
    (( high - low > 1 )) || break
    middle=$(( (low + high) / 2 ))
    if run "$label" "$middle"; then low=$middle; else high=$middle; fi
  done
}
# (label, sure, may): each configuration's prediction; `bash bench/convolution_edge.sh OUT 2`
# checks from the second on.
checks=("resnet-50 bf16 B adamw_torch,3254,3308" "convnext-tiny bf16 B adamw_torch,2355,2362"
        "resnet-50 fp32 B sgd,1688,1716" "mobilenet-v2 fp32 B sgd,1793,1826")
for entry in "${checks[@]:$(( ${2:-1} - 1 ))}"; do
  IFS=, read -r label sure may <<< "$entry"
  check "$label" "$sure" "$may"
done

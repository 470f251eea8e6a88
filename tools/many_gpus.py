"""A stored run of many GPUs on several hosts, synthesized: what the pages draw for 8 and 64 GPUs
(tests/unit/test_many_gpus.py; bench/many_gpus.py times it). No machine here has that many.

Each rank's memory follows the 2 × FSDP bert-large run measured on two H200s
(docs/data/scaling-h200x2.json: 620 MB at the CUDA context, 1,288 MB of weights, 8,018 MB at the
peak, bf16, batch 8 × 512), a step every 0.3 s rising from the step's low to its peak; each GPU
within ±1 % of the others. Two ranks differ, as real runs do and as the views must show: one
peaks 9 % higher (`heavy_rank`), one starts 2.5 s late (`late_rank`, a straggler).
The run is a watched command's (`anatomy watch -- torchrun --nnodes …`), the way a run of several
hosts is recorded.

    PYTHONPATH=. python -m tools.many_gpus STORE.sqlite --hosts 8 --gpus-per-host 8
"""

from __future__ import annotations

import argparse
import random

from anatomy.store import PhaseMark, Sample, Step, Store, device_key

MIB = 2**20
H200_TOTAL = 143_771 * MIB
KERNEL, WEIGHTS, PEAK = 620 * MIB, 1_288 * MIB, 8_018 * MIB
LOW = 0.55  # a step's lowest memory, as a fraction of its peak (activations freed)
STEP_S = 0.3
HEAVY = 1.09  # one rank's peak over the others'
LATE_S = 2.5  # one rank's every phase, late


def heavy_rank(world: int) -> int:
    return world // 2 - 1


def late_rank(world: int) -> int:
    return world - 2


def _phases(rank: int, world: int, training_s: float) -> list[tuple[str, float, float]]:
    """(name, start, end) of a rank's phases; the baseline is the watch's, rank 0's alone."""
    late = LATE_S if rank == late_rank(world) else 0.0
    phases = [("baseline", 0.05, 1.0)] if rank == 0 else []
    return phases + [("kernel", 2.0 + late, 3.0 + late), ("weights", 4.0 + late, 5.0 + late),
                     ("training", 5.5 + late, 5.5 + late + training_s)]


def _level(t: float, phases: list[tuple[str, float, float]], peak: float) -> float:
    """A rank's GPU memory at time t: nothing before its context, each phase's level from its
    start, training's steps rising from LOW × peak to peak every STEP_S; nothing once it ends."""
    named = {name: (start, end) for name, start, end in phases}
    if t < named["kernel"][0] - 0.4:
        return 0.0
    if t < named["weights"][0] - 0.4:
        return KERNEL
    start, end = named["training"]
    if t < start:
        return KERNEL + WEIGHTS
    if t > end + 0.3:
        return 0.0
    within = ((t - start) % STEP_S) / STEP_S
    return KERNEL + WEIGHTS + (peak - KERNEL - WEIGHTS) * (LOW + (1 - LOW) * within)


def add_run(store: Store, hosts: int = 8, gpus_per_host: int = 8, rate: float = 50.0,
            training_s: float = 30.0, model: str = "bert-large-uncased", seq_len: int = 512,
            seed: int = 21) -> int:
    """A completed run of `hosts` × `gpus_per_host` ranks (rank r on host r // gpus_per_host,
    its GPU r % gpus_per_host), sampled at `rate` Hz per GPU; its id. `model` and `seq_len`
    are what the Anatomy page predicts for (the memory stays bert-large's)."""
    rng = random.Random(seed)
    world = hosts * gpus_per_host
    names = [f"node-{h}" for h in range(hosts)]
    options = {"model": model, "batch_size": 8, "seq_len": seq_len,
               "precision": "bf16", "strategy": "fsdp"}
    environment = {"gpu_name": "NVIDIA H200", "gpu_total": H200_TOTAL, "world_size": world,
                   "strategy": "fsdp", "gpus": [r % gpus_per_host for r in range(world)],
                   "hosts": names, "rank_hosts": [r // gpus_per_host for r in range(world)]}
    command = ["torchrun", "--nnodes", str(hosts), "--nproc-per-node", str(gpus_per_host),
               "train.py"]
    run_id = store.create_run(options, "nvml", "v2", 0, environment, preset=model,
                              source={"kind": "watch", "command": command, "host": names[0]})
    end = 5.5 + LATE_S + training_s + 1.0
    count = int(training_s / STEP_S)
    for rank in range(world):
        phases = _phases(rank, world, training_s)
        peak = PEAK * rng.uniform(0.99, 1.01) * (HEAVY if rank == heavy_rank(world) else 1.0)
        device = device_key(rank // gpus_per_host, rank % gpus_per_host)
        samples = [Sample(i / rate, device, int(_level(i / rate, phases, peak)), None, H200_TOTAL,
                          None) for i in range(int(end * rate) + 1)]
        marks = [PhaseMark(edge, name, t, rank) for name, start, stop in phases
                 for edge, t in (("start", start), ("end", stop))]
        start = phases[-1][1]
        steps = [Step(start + STEP_S * k, k, count, round(2.0 / k ** 0.3, 4),
                      int(peak * 0.8), int(peak * 1.05), rank) for k in range(1, count + 1)]
        store.write(run_id, samples=samples, phases=marks, steps=steps)
    samples_per_second = world * options["batch_size"] / STEP_S
    store.update_run(run_id, summary={"time_s": training_s, "steps": count,
                                      "samples_per_second": samples_per_second},
                     samples_sent=int(end * rate + 1) * world)
    store.finish(run_id, "completed")
    return run_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--gpus-per-host", type=int, default=8)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=60.0, help="of training")
    args = parser.parse_args()
    run_id = add_run(Store(args.store), args.hosts, args.gpus_per_host, args.rate, args.seconds)
    print(f"run {run_id}: {args.hosts} × {args.gpus_per_host} GPUs in {args.store}")


if __name__ == "__main__":
    main()

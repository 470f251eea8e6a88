"""What anatomy costs the training it measures: the same Trainer run without anatomy, with the
callback at 200 Hz and 1 kHz, and under `anatomy watch` at 200 Hz and 1 kHz, interleaved; and
the Trainer's own defaults beside the walkthrough's arguments.

    PYTHONPATH=. python bench/overhead.py --rounds 3 --output results.jsonl

Each round runs bench/overhead_train.py three times, one after another: plainly (variants
walkthrough, callback200, callback1000, defaults, defaults-log1, defaults-adamw, each
--repeats times, interleaved), under `anatomy watch --sample-rate 1000`, and under
`anatomy watch --sample-rate 200` (variant walkthrough: the watch is the only anatomy there).
Prints a markdown table: each variant's median steady throughput (samples/s between the
warm-up's end and the end, the GPU synchronised at both), its ratio to the plain walkthrough
run, and the host's step-time distribution. Results in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "overhead_train.py"
PLAIN_VARIANTS = "walkthrough,callback200,callback1000,defaults,defaults-log1,defaults-adamw"


def run_round(output: Path, args: argparse.Namespace, round_: int) -> None:
    common = [str(TRAIN), "--output", str(output), "--repeats", str(args.repeats),
              "--steps", str(args.steps), "--warmup", str(args.warmup)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, (str(HERE.parent), os.environ.get("PYTHONPATH"))))}
    runs = [[sys.executable, *common, "--variants", args.variants, "--label", "plain"]]
    for rate in (1000, 200):
        runs.append([sys.executable, "-m", "anatomy", "watch", "--sample-rate", str(rate),
                     "--name", f"overhead watch {rate}", "--", sys.executable, *common,
                     "--variants", "walkthrough", "--label", f"watch{rate}"])
    # Every process is a fresh start (its own CUDA context, clocks, autotuning): the plain process
    # and the watched ones swap places every other round, so neither always runs first.
    for command in (runs if round_ % 2 == 0 else runs[::-1]):
        subprocess.run(command, check=True, env=env)


def table(records: list[dict]) -> str:
    groups: dict[str, list[dict]] = {}
    for record in records:
        name = record["variant"] if record["label"] == "plain" else record["label"]
        groups.setdefault(name, []).append(record)
    base = statistics.median(r["steady_samples_per_second"] for r in groups["walkthrough"])
    lines = ["| variant | runs | samples/s (median) | ratio to walkthrough | step ms p50 | "
             "step ms p95 |", "|---|---:|---:|---:|---:|---:|"]
    for name, rows in groups.items():
        speed = statistics.median(r["steady_samples_per_second"] for r in rows)
        lines.append(f"| {name} | {len(rows)} | {speed:.2f} | {speed / base:.4f} | "
                     f"{statistics.median(r['step_ms_p50'] for r in rows):.1f} | "
                     f"{statistics.median(r['step_ms_p95'] for r in rows):.1f} |")
    first = records[0]
    return (f"{first['device']}, {first['model']}, batch size {first['batch_size']}, sequence "
            f"length {first['seq_len']}, {first['steps']} steps ({first['warmup']} warm-up)\n\n"
            + "\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1, help="of each variant, per round")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--output", type=Path, default=Path("overhead.jsonl"))
    parser.add_argument("--variants", default=PLAIN_VARIANTS,
                        help="of the plain process (bench/overhead_train.py's names)")
    parser.add_argument("--table-only", action="store_true", help="summarise --output")
    args = parser.parse_args()
    if not args.table_only:
        for round_ in range(args.rounds):
            print(f"round {round_ + 1} of {args.rounds}", file=sys.stderr, flush=True)
            run_round(args.output, args, round_)
    records = [json.loads(line) for line in args.output.read_text().splitlines() if line]
    print(table(records))


if __name__ == "__main__":
    main()

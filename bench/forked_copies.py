"""A CPU training whose DataLoader forks workers, under `anatomy watch`: the recorded peak next
to the process tree's PSS (each page counted once, shared pages split among their sharers)
polled from inside the script. Without a GPU anatomy records the tree's RSS, and a forked
worker's RSS counts the pages it shares with its parent (engine/sampler.py, `_ProcessTree`).

    PYTHONPATH=. python bench/forked_copies.py [--workers 4]

Prints the watch's peak line and the PSS peak; the results and the machine are in
docs/measurements/cpu-forked-copies-2026-12-07.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

# The training: two 4096×4096 layers under AdamW (33.6 M parameters: 128 MiB of weights, as
# much again of gradients, twice that of optimizer states), two epochs of 2,048 random rows in
# batches of 64; a thread sums the tree's PSS every 50 ms.
SCRIPT = """
import sys, threading, time
import psutil, torch
from torch.utils.data import DataLoader, TensorDataset

model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 4096))
optimizer = torch.optim.AdamW(model.parameters())
data = TensorDataset(torch.randn(2048, 4096))
peak, done = 0, False

def poll():
    global peak
    me = psutil.Process()
    while not done:
        total = 0
        for process in [me, *me.children(recursive=True)]:
            try:
                total += process.memory_full_info().pss
            except psutil.Error:
                pass
        peak = max(peak, total)
        time.sleep(0.05)

poller = threading.Thread(target=poll, daemon=True)
poller.start()
for epoch in range(2):
    for (x,) in DataLoader(data, batch_size=64, num_workers=int(sys.argv[1])):
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
done = True
poller.join()
print(f"the tree's PSS peaked at {peak / 2**20:,.0f} MiB")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "train.py"
        script.write_text(SCRIPT)
        result = subprocess.run(
            [sys.executable, "-m", "anatomy", "watch", "--store", str(Path(folder) / "s.sqlite"),
             "--", sys.executable, str(script), str(args.workers)],
            capture_output=True, text=True, check=False)
    for line in (result.stdout + result.stderr).splitlines():
        if "PSS" in line or "peak" in line:
            print(line)


if __name__ == "__main__":
    main()

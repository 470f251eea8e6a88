"""A hand-written PyTorch training loop, recorded with anatomy's phase API.

    python examples/plain_loop.py                   # records a run into the store
    anatomy watch -- python examples/plain_loop.py  # the same, under `anatomy watch`

Then open the dashboard (`make run`) or `anatomy show RUN_ID`. The model is a tiny GPT-2 built
from its config (random weights), the data random token ids: small enough for a CPU.
"""

import argparse

import anatomy

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--seq-len", type=int, default=64)
args = parser.parse_args()

# At the top, before the model exists: the baseline, then torch and the CUDA context.
run = anatomy.start(name="plain loop: tiny GPT-2")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

device = "cuda" if torch.cuda.is_available() else "cpu"
config = GPT2Config(n_layer=2, n_head=2, n_embd=128, vocab_size=1000, n_positions=args.seq_len)
model = GPT2LMHeadModel(config).to(device)
run.phase("weights")  # the model is on its device

optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
generator = torch.Generator().manual_seed(0)
run.phase("training")
for step in range(1, args.steps + 1):
    batch = torch.randint(0, config.vocab_size, (args.batch_size, args.seq_len),
                          generator=generator).to(device)
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    run.step(loss=loss.item(), step=step, total=args.steps, batch_size=args.batch_size)
run.end()
print(f"recorded run {run.id}")

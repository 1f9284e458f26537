"""The training step's cost of each cell of study_streams_mtp, side by side in one process: forward (with the
multi-token prediction modules' loss where D > 0), backward and AdamW at the study's sizes (d 64, 4 heads,
batch 16 x 64 characters), every cell timed in turn each round after a warm-up, as the ratio to the plain
stream without MTP at the same depth (the median over rounds of the per-round ratio).

    OMP_NUM_THREADS=2 python experiments/streams_mtp/step_cost.py > experiments/streams_mtp/step_cost.txt
"""

from __future__ import annotations

import statistics

import torch

from archlab import build_model, compose_model
from archlab.bench.harness import time_alternating
from archlab.nn.loss import next_token_loss

VARIANTS = {
    "plain": [],
    "value_residual": ["model.attention.value_residual=true"],
    "hyper": ["model/stream=hyper", "model.stream.n=4"],
    "mhc": ["model/stream=mhc", "model.stream.n=4"],
}
SIZES = ["model.d_model=64", "model.attention.n_head=4", "model.vocab_size=65", "model.context_length=64"]


def step_fn(overrides: list[str]):
    torch.manual_seed(0)
    model = build_model(compose_model(["model=nano", *SIZES, *overrides]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 65, (16, 64))
    y = torch.randint(0, 65, (16, 64))

    def step() -> None:
        loss = next_token_loss(model(x, targets=y), y)
        for weight, aux in model.auxiliary_losses().values():
            loss = loss + weight * aux
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main() -> None:
    torch.set_num_threads(2)
    for layers in (2, 4):
        cells = {
            (v, d): step_fn([*o, f"model.n_layer={layers}", f"model.head.mtp.depth={d}"])
            for v, o in VARIANTS.items()
            for d in (0, 1, 2)
        }
        times = time_alternating({f"{v} D={d}": fn for (v, d), fn in cells.items()}, warmup=2, repeats=9, device=torch.device("cpu"))
        base = times["plain D=0"]
        print(f"{layers} layers: step time against plain D=0 (median of per-round ratios; plain D=0 {statistics.median(base) * 1000:.1f} ms)")
        for name, t in times.items():
            ratio = statistics.median(a / b for a, b in zip(t, base))
            print(f"  {name:<20} {statistics.median(t) * 1000:8.1f} ms  x{ratio:.2f}")


if __name__ == "__main__":
    main()

"""What ``callbacks.health`` costs: a training step with the per-layer health probe against the same step
without it, alternating in one process (issue 43, docs/performance.md).

    python scripts/bench_health.py --threads 1
    python scripts/bench_health.py --d-model 512 --n-layer 12 --device cuda

A step is AdamW on one batch: forward, backward, optimizer step. The measured step also hooks every block,
takes the gradient norms per block and per μP role, copies the weights and compares them after the update
(``archlab.training.health.Probe``), which the callback does on every K-th step only; the steps between
run untouched. So the figure to read is the health step's time over the plain step's (the median of the
per-round ratios), and the cost per step averaged over K steps, (ratio − 1) / K."""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from archlab import build_model
from archlab.bench.harness import paired_ratio, time_alternating
from archlab.config import to_model_config
from archlab.training.health import Probe
from archlab.training.parametrization import roles


def main() -> None:
    parser = argparse.ArgumentParser(
        description="What callbacks.health costs: a step with the probe against one without"
    )
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-layer", type=int, default=6)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--every", type=int, nargs="+", default=[10, 50], help="K: the averaged cost at these")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = to_model_config(
        {
            "vocab_size": args.vocab,
            "context_length": args.length,
            "n_layer": args.n_layer,
            "d_model": args.d_model,
            "attention": {"n_head": args.n_head},
        }
    )
    torch.manual_seed(0)
    model = build_model(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    probe = Probe(model, roles(model))
    batch = torch.randint(0, args.vocab, (args.batch, args.length + 1), device=device)

    def step(measured: bool) -> None:
        if measured:
            probe.watch()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        if measured:
            probe.gradients()
        optimizer.step()
        if measured:
            probe.updates()

    times = time_alternating(
        {"plain": lambda: step(False), "health": lambda: step(True)}, warmup=3, repeats=args.repeats, device=device
    )
    q1, ratio, q3 = paired_ratio(times["plain"], times["health"])
    plain = sorted(times["plain"])[len(times["plain"]) // 2]
    params = sum(p.numel() for p in model.parameters())
    print(
        f"d_model {args.d_model}, {args.n_layer} layers, {params:,} parameters, batch {args.batch}×{args.length}, "
        f"{args.device}, {args.threads} thread(s): plain step {plain * 1e3:.1f} ms (median)"
    )
    print(f"health step / plain step: {ratio:.3f} (quartiles {q1:.3f}-{q3:.3f})")
    for k in args.every:
        print(f"every {k} steps: +{(ratio - 1) / k:.2%} per step on average")


if __name__ == "__main__":
    main()

"""Self-speculative decoding against greedy decoding, on a model with multi-token prediction modules
(archlab.speculative, docs/generation.md): the drafts kept, the model's forwards per new token, and the time
of both decodings side by side in one process.

    python scripts/bench_speculative.py outputs/mtp --prompt "ROMEO:" --new 200 --threads 2

The model is found as archlab-generate finds it (a run directory, a checkpoint, a safetensors file, a Hugging
Face directory); its tokenizer encodes the prompt. Both decodings are checked to give the same ids first,
then timed alternating after a warm-up: the figure to read is the ratio (greedy / speculative, above 1:
speculative faster), the median of the per-round ratios."""

from __future__ import annotations

import argparse

import torch

from archlab.bench.harness import paired_ratio, time_alternating
from archlab.evaluation.models import find_model, load
from archlab.generate import generate
from archlab.speculative import speculate


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("model", help="a run directory, checkpoint, safetensors file or Hugging Face directory")
    parser.add_argument("--prompt", default="ROMEO:", help="text the model's tokenizer encodes")
    parser.add_argument("--new", type=int, default=200, help="tokens to generate")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (after one untimed)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    found = find_model(args.model, "model")
    if found.tokenizer is None:
        raise SystemExit(f"{args.model} holds no tokenizer: the prompt cannot be encoded")
    model = load(found).eval()
    prompt = torch.tensor([found.tokenizer.encode(args.prompt)], dtype=torch.long)
    greedy = generate(model, prompt, args.new, temperature=0.0)
    drafted = speculate(model, prompt, args.new)
    if not torch.equal(greedy, drafted.ids):
        raise SystemExit("speculative decoding gave other ids than greedy decoding")
    depth = model.cfg.head.mtp.depth
    print(f"model: {args.model}, {depth} MTP modules; prompt {prompt.shape[1]} tokens, {args.new} new")
    print(
        f"drafts kept: {drafted.accepted} of {drafted.drafted} ({drafted.accepted / max(drafted.drafted, 1):.1%}); "
        f"forwards of the model: {drafted.rounds} for {args.new} tokens ({drafted.rounds / args.new:.3f} per token; "
        f"greedy: {args.new - 1})"
    )
    times = time_alternating(
        {
            "greedy": lambda: generate(model, prompt, args.new, temperature=0.0),
            "speculative": lambda: speculate(model, prompt, args.new),
        },
        warmup=1,
        repeats=args.repeats,
        device=torch.device("cpu"),
    )
    q1, mid, q3 = paired_ratio(times["speculative"], times["greedy"])
    for name, t in times.items():
        print(f"{name:>12}: {min(t) * 1000:8.1f} ms best, {args.new / min(t):8.1f} tokens/s")
    print(f"greedy / speculative time: {mid:.2f} (quartiles {q1:.2f}-{q3:.2f})")


if __name__ == "__main__":
    main()

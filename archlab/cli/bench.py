"""archlab-bench: training-step and generation speed of a composed model against the Hugging Face model of
its layout (same weights, dtype, threads and batch), with memory per step and the machine's matmul ceiling;
for a layout with MoE layers, archlab's step split into router, permutation, expert MLPs and the rest.
With ``contexts=[...]``, the context sweep instead: how step time, memory and decoding grow with the context
for attention, Gated DeltaNet, the 3:1 hybrid and Mamba-2 (``archlab/bench/context.py``).

    archlab-bench model=gpt2 model.n_layer=6 model.d_model=384 model.attention.n_head=6 threads=2
    archlab-bench compile=true format=json
    archlab-bench contexts=[256,512,1024,2048] tokens_per_step=4096 plot=context_cost.png
"""

from __future__ import annotations

import json

import hydra
from omegaconf import DictConfig

from archlab.cli.errors import short_config_errors
from archlab.cli.settings import run_hydra_command
from archlab.config.commands import BenchConfig
from archlab.config.store import register_configs

register_configs()


def _print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"device {result['device']} ({result['threads']} threads), precision {result['precision']}, "
        f"{'torch.compile' if result['compiled'] else 'eager'}, batch {result['batch_size']} x {result['seq_len']} "
        f"tokens; analytic {result['flops_per_token'] / 1e6:.1f} MFLOP/token; dense matmul ceilings "
        + ", ".join(f"{d} {v / 1e9:.1f}" for d, v in result["matmul_flops_by_dtype"].items())
        + f" GFLOP/s (the step is measured against {result['compute_dtype']}'s); "
        f"generation: {result['generate_tokens']} tokens; attention: {result['attention_path']}"
    )
    names = [n for n in result["train"] if not n.startswith("ratio")]
    table = Table("measure", *names, "archlab / hf (per-round IQR)")

    def row(label, section, key, fmt):
        cells = [fmt(result[section][n][key]) if key in result[section][n] else "-" for n in names]
        ratio = result[section].get("ratio")
        spread = "({:.2f}–{:.2f})".format(*result[section]["ratio_quartiles"]) if ratio else ""
        table.add_row(label, *cells, f"{ratio:.2f}x {spread}" if ratio and key == "tokens_per_s" else "")

    row("train tokens/s", "train", "tokens_per_s", lambda v: f"{v:,.0f}")
    row("train step (s)", "train", "step_s", lambda v: f"{v:.3f}")
    row("achieved GFLOP/s", "train", "flops", lambda v: f"{v / 1e9:.1f}")
    row(f"fraction of {result['compute_dtype']} matmul ceiling", "train", "fraction_of_matmul", lambda v: f"{v:.2f}")
    row("MFU (peak of the dtype timed)", "train", "mfu", lambda v: f"{v:.3f}")
    row("  of the step: in matmul kernels (s)", "train", "matmul_s", lambda v: f"{v:.3f}")
    row("  in attention kernels (s)", "train", "attention_s", lambda v: f"{v:.3f}")
    row("  fraction of ceiling if only those ran", "train", "floor_fraction_of_matmul", lambda v: f"{v:.2f}")
    parts = {
        "router": "MoE router, aux losses",
        "permutation": "MoE permutation",
        "experts": "MoE expert MLPs",
        "other": "the rest",
    }
    for part, label in parts.items():  # a MoE layout: where the step goes, each part with its backward
        cells = [
            f"{result['train'][n]['moe_split_s'][part]:.3f} ({result['train'][n]['moe_split_fraction'][part]:.0%})"
            if "moe_split_s" in result["train"][n]
            else "-"
            for n in names
        ]
        if any(c != "-" for c in cells):
            table.add_row(f"  {label}, fwd+bwd (s)", *cells, "")
    row("generate tokens/s (batch 1)", "generate", "tokens_per_s", lambda v: f"{v:,.1f}")
    console.print(table)
    for mode, figures in result["memory"].items():
        text = ", ".join(f"{k.replace('_', ' ')} {v / 2**20:.1f} MiB" for k, v in figures.items())
        console.print(f"archlab memory per step ({mode}): {text}")


def _print_sweep(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    names = list(result["variants"])
    console.print(
        f"context sweep on {result['device']} ({result['threads']} threads), precision {result['precision']}, "
        f"{result['tokens_per_step']:,} tokens per training step, {result['repeats']} timed rounds; decoding: "
        f"{result['decode_tokens']} tokens after a prefill of the context, batch 1; variants: "
        + "; ".join(f"{n} ({v['selects']}, {v['params'] / 1e6:.2f}M parameters)" for n, v in result["variants"].items())
    )
    rows = {(r["variant"], r["context"]): r for r in result["rows"]}
    table = Table("context", *names, title="training step s (x the previous context) / peak MiB")
    for c in result["contexts"]:
        cells = []
        i = result["contexts"].index(c)
        for n in names:
            r, before = rows[(n, c)], rows[(n, result["contexts"][i - 1])] if i else {}
            if "skipped" in r:
                cells.append("skipped")
                continue
            growth = f" (x{r['step_s'] / before['step_s']:.2f})" if "step_s" in before else ""
            cells.append(f"{r['step_s']:.3f}{growth} / {r['peak_step_bytes'] / 2**20:,.0f}")
        table.add_row(f"{c:,}", *cells)
    console.print(table)
    table = Table("context", *names, title="decoding ms per token / state MiB (closed form)")
    for c in result["contexts"]:
        cells = [
            "skipped"
            if "skipped" in rows[(n, c)]
            else "{:.2f} / {:.3f} ({:.3f})".format(
                rows[(n, c)]["decode_s_per_token"] * 1e3,
                rows[(n, c)]["state_bytes"] / 2**20,
                rows[(n, c)]["state_bytes_closed_form"] / 2**20,
            )
            for n in names
        ]
        table.add_row(f"{c:,}", *cells)
    console.print(table)
    table = Table("growth exponent (x per doubling)", *names, title=f"fitted over contexts >= {result['fit_from']:,}")

    def exponent(fit: dict) -> str:
        e = fit["exponent"]
        return "-" if e is None else f"{e:.2f} (x{fit['ratio_per_doubling']:.2f})"

    for key, label in (
        ("step_s", "training step"),
        ("peak_step_bytes", "peak step memory"),
        ("decode_s_per_token", "decoding per token"),
        ("state_bytes", "decoding state"),
    ):
        table.add_row(label, *(exponent(result["fits"][n][key]) for n in names))
    table.add_row(
        "step, each doubling",
        *(
            " ".join(f"x{d['ratio_per_doubling']:.2f}" for d in result["fits"][n]["step_s"]["neighbours"])
            for n in names
        ),
    )
    console.print(table)
    for r in result["rows"]:
        if "skipped" in r:
            console.print(f"skipped {r['variant']} at context {r['context']:,}: {r['skipped']}")
    if result["plot"]:
        console.print(f"plot: {result['plot']}")


@hydra.main(version_base="1.3", config_path="pkg://archlab.conf", config_name="bench")
@short_config_errors
def bench_app(cfg: DictConfig) -> None:
    from archlab.bench.harness import run_bench

    if cfg.contexts is not None:
        from archlab.bench.context import run_context_sweep

        result = run_context_sweep(cfg)
        if cfg.format == "json":
            print(json.dumps(result))
        else:
            _print_sweep(result)
        return
    result = run_bench(cfg)
    if cfg.format == "json":
        print(json.dumps(result))
    else:
        _print_table(result)


def main() -> None:
    """The console script: ``--help`` lists this command's settings and model groups; the rest is Hydra's."""
    run_hydra_command("archlab-bench", __doc__, "bench", BenchConfig, bench_app)


if __name__ == "__main__":
    main()

"""archlab-bench: training-step and generation speed of a composed model against the Hugging Face model of
its layout (same weights, dtype, threads and batch), with memory per step and the machine's matmul ceiling;
for a layout with MoE layers, archlab's step split into router, permutation, expert MLPs and the rest.

    archlab-bench model=gpt2 model.n_layer=6 model.d_model=384 model.attention.n_head=6 threads=2
    archlab-bench compile=true format=json
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


@hydra.main(version_base="1.3", config_path="pkg://archlab.conf", config_name="bench")
@short_config_errors
def bench_app(cfg: DictConfig) -> None:
    from archlab.bench.harness import run_bench

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

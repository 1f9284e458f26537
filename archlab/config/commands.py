"""Schemas of the commands other than archlab-train: archlab-check, archlab-bench, archlab-generate,
archlab-export, archlab-interop, archlab-prepare, archlab-report, archlab-eval and archlab-average (plain
dataclasses; the Hydra ones are stored by ``archlab.config.store``). Each field's ``help`` is the line
``--help`` prints beside it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from archlab.config.fields import setting
from archlab.config.model import ModelConfig
from archlab.config.train import MatchConfig, ParamConfig


@dataclass
class CheckConfig:
    """``archlab-check``: one composed model, or (with no ``model=``) every preset."""

    model: ModelConfig = field(default_factory=ModelConfig)
    match: MatchConfig = field(
        default_factory=MatchConfig,
        metadata={"help": "archlab-train's match, previewed: what it sets, and the model sized by it"},
    )
    format: str = setting("table", "table or json")


@dataclass
class BenchConfig:
    """``archlab-bench``: one composed model against the Hugging Face implementation of its layout."""

    model: ModelConfig = field(default_factory=ModelConfig)
    batch_size: int = setting(8, "sequences per training step")
    seq_len: Optional[int] = setting(None, "tokens per sequence; null = model.context_length")
    warmup: int = setting(2, "untimed rounds before the timed ones")
    repeats: int = setting(10, "timed (and profiled) rounds; figures are medians")
    generate_tokens: Optional[int] = setting(
        None, "greedy tokens generated at batch 1 after an 8-token prompt; null = fill the context"
    )
    device: str = setting("auto", "auto, cpu, cuda or cuda:<index>")
    precision: str = setting(
        "32-true",
        "32-true (float32), bf16-mixed (float32 weights, bf16 autocast, both sides) or bf16-true (bf16 weights)",
    )
    threads: Optional[int] = setting(None, "torch threads (CPU); null = torch's default")
    compare_hf: bool = setting(True, "also time the Hugging Face model of the same layout")
    compile: bool = setting(False, "torch.compile the training step (archlab block by block, HF whole)")
    matmul_size: Optional[int] = setting(
        None, "side of the square matmul measuring the ceiling; null = 2048 / 8192 (GPU)"
    )
    checkpointing: bool = setting(True, "also measure activation memory with activation checkpointing on")
    format: str = setting("table", "table or json")
    # the context sweep (archlab/bench/context.py): set contexts to run it instead of the comparison with HF
    contexts: Optional[List[int]] = setting(
        None,
        "context sweep, e.g. [256,512,1024]: per variant and context the training step's time and peak memory, "
        "decoding's time per token and state bytes, and the growth exponents; null = archlab against HF",
    )
    tokens_per_step: int = setting(
        8192, "context sweep: tokens per training step, held fixed (batch = tokens_per_step / context)"
    )
    variants: Optional[List[str]] = setting(
        None,
        "context sweep: of attention (the model as composed), gated_deltanet (model/attention=gated_deltanet), "
        "hybrid_3_1 (model/layers=deltanet_3_1), mamba2 (model/attention=mamba2); null = all four",
    )
    decode_tokens: int = setting(
        16, "context sweep: tokens decoded one at a time after each prefill (the model's context grows to fit)"
    )
    fit_from: int = setting(1024, "context sweep: the least-squares growth exponent is fitted over contexts >= this")
    memory_cap_mib: Optional[int] = setting(
        None,
        "context sweep: skip a variant's context whose step would exceed this many MiB (by its smaller "
        "contexts' trend) or did; null = 90% of the device's free memory",
    )
    plot: Optional[str] = setting(None, "context sweep: the PNG to draw its curves into; null = none")


@dataclass
class CoordConfig:
    """``archlab-coord``: the coordinate check of a parametrisation, one composed model at several sizes."""

    model: ModelConfig = field(default_factory=ModelConfig)
    param: ParamConfig = field(default_factory=ParamConfig)
    widths: Optional[List[int]] = field(
        default_factory=lambda: [64, 128, 256, 512], metadata={"help": "the d_model values to train; null = none"}
    )
    depths: Optional[List[int]] = setting(None, "also the n_layer values to train at model.d_model, e.g. [2,4,8,16]")
    steps: int = setting(4, "optimizer steps on one fixed batch of random tokens")
    lr: float = setting(1e-2, "the learning rate (large: the growth under sp shows within a few steps)")
    optimizer: str = setting(
        "adamw",
        "the optimizer, with param's rules for it: adamw (no decay), muon (match_rms_adamw; AdamW on the tables, "
        "norms and biases) or sgd (momentum 0.9)",
    )
    batch_size: int = setting(8, "sequences in the batch")
    seq_len: int = setting(64, "tokens per sequence")
    plot: Optional[str] = setting(
        None, "a PNG of RMS against width, or depth (with both: <name>_depth.png against depth); null = none"
    )
    format: str = setting("table", "table or json")


@dataclass
class GenerateConfig:
    """``archlab-generate``: a saved model, a prompt and how to sample its continuation."""

    ckpt: Optional[str] = setting(
        None,
        "the model: a run directory, a training checkpoint (.ckpt), a safetensors file written by archlab or a "
        "Hugging Face directory (archlab-export's) (a bare path is taken as ckpt)",
    )
    prompt: Optional[str] = setting(None, "text, taken verbatim, encoded with the model's tokenizer")
    prompt_ids: Optional[List[int]] = setting(None, "token ids, e.g. [1,2,3], for a model without a tokenizer")
    max_new_tokens: int = setting(100, "tokens to generate after the prompt")
    temperature: float = setting(1.0, "softmax temperature; 0 = greedy")
    top_k: Optional[int] = setting(None, "sample among the k most likely tokens; null = all")
    seed: Optional[int] = setting(0, "sampling seed; null = a different sample every run")
    device: str = setting("cpu", "cpu, cuda or cuda:<index>")
    speculative: bool = setting(
        False,
        "greedy tokens drafted by the model's multi-token prediction modules and checked by the model in one "
        "forward per round: the same tokens as temperature=0, in fewer forwards (needs temperature=0)",
    )


@dataclass
class ExportConfig:
    """``archlab-export``: a trained model, with its tokenizer, as a Hugging Face directory."""

    source: str = setting(
        help="a run directory (its model.safetensors), a training checkpoint (.ckpt) or a safetensors file written "
        "by archlab (a bare path is taken as source)"
    )
    out: str = setting(help="the new (or empty) directory to write the Hugging Face model and tokenizer into")
    format: str = setting("hf", "hf: config.json, model.safetensors and tokenizer.json for transformers' Auto classes")
    family: Optional[str] = setting(
        None,
        "the Hugging Face model_type to write where several hold the layout exactly (archlab-check lists them); "
        "null = the one archlab-interop lists first",
    )


@dataclass
class AverageConfig:
    """``archlab-average``: the mean of a run's last k checkpoints, as a safetensors file."""

    run: str = setting(help="a run directory: its checkpoints/*.ckpt are averaged (a bare path is taken as run)")
    last: int = setting(help="how many of the run's newest checkpoints (by step) to average")
    out: Optional[str] = setting(None, "the .safetensors file to write; null = <run>/model_last<k>.safetensors")


@dataclass
class InteropConfig:
    """``archlab-interop``: the Hugging Face classes archlab converts and those it refuses, or one config."""

    config: Optional[str] = setting(
        None, "a Hugging Face checkpoint directory or config.json: does it load? (a bare path is taken as config)"
    )
    format: str = setting("text", "text, markdown (docs/interop.md's tables) or json")


@dataclass
class PrepareConfig:
    """``archlab-prepare``: tokenise a text file or a corpus into shards for ``data=tokens``."""

    input: str = setting(
        help="a UTF-8 text file, or a corpus: a .jsonl, .jsonl.gz or .parquet file, a directory or glob of them, "
        "or a datasets save_to_disk directory (a bare path is taken as input)"
    )
    output: str = setting(help="the directory to write train.bin, val.bin and meta.json into")
    tokenizer: str = setting(
        "char", "char, byte or bpe (fitted to the input), or a tokenizer.json or a Hugging Face model directory"
    )
    vocab_size: Optional[int] = setting(None, "bpe only: the vocabulary to train")
    val_fraction: float = setting(
        0.1,
        "the validation split: the last fraction of a text's tokens, or that fraction of a corpus's documents; "
        "1 = evaluation only (val.bin alone, with a training run's tokenizer)",
    )
    format: str = setting("auto", "auto (by the input's name), text, jsonl, parquet or datasets")
    text_field: str = setting("text", "a corpus: the field of each record that holds its text")
    eos: Optional[str] = setting(None, "a corpus: the token that ends each document; null = the tokenizer's EOS")
    dtype: Optional[str] = setting(None, "uint16 or uint32; null = the smaller that holds every id")
    workers: Optional[int] = setting(None, "a corpus: tokenising processes; null = the CPUs available, at most 8")
    chunk_documents: int = setting(1000, "a corpus: documents per chunk, the unit an interrupted run continues from")


@dataclass
class ReportConfig:
    """``archlab-report``: a sweep's runs summarised as a table, a CSV and plots."""

    sweep_dir: str = setting(
        help="a Hydra multirun directory or any folder of runs (a bare path is taken as sweep_dir)"
    )
    out: Optional[str] = setting(None, "where to write report.md, report.csv and the plots; null = sweep_dir")
    metric: Optional[str] = setting(
        None,
        "the final metric that leads the table and is plotted (val/loss; an evaluation's: eval/<set>/ppl, "
        "'eval <task> acc'); null = the runs' primary one",
    )
    baseline: Optional[str] = setting(
        None, "<axis>=<value>, e.g. model/mlp=gelu: every other variant minus this one, paired by seed; null = none"
    )
    best_over: Optional[str] = setting(
        None, "a swept axis, e.g. optim.lr: each variant at its value with the best mean metric; null = none"
    )
    scaling: Optional[str] = setting(
        None,
        "a swept size axis, e.g. model.d_model: fit L = a*X^-b + e against FLOPs and parameters; "
        "ND: a ladder, L(N, D) = E + A/N^alpha + B/D^beta over every run, and the compute-optimal N and D; null = none",
    )
    transfer: Optional[str] = setting(
        None,
        "with best_over, a swept axis and its proxy, e.g. model.d_model=64: how the best value moves along it, "
        "and the cost of the proxy's; null = none",
    )
    spike_factor: float = setting(
        1.2, "a loss spike: a logged training loss above this many times the median of those before it"
    )
    spike_window: int = setting(10, "how many logged training losses before a step that running median takes")
    lr_tolerance: float = setting(
        0.01, "stability: the largest optim.lr whose mean final metric is within this fraction of the best"
    )
    ignore: Optional[str] = setting(
        None, "override keys, comma-separated, that make no variant (e.g. trainer.accelerator); null = none"
    )


@dataclass
class EvalConfig:
    """``archlab-eval``: lm-evaluation-harness tasks, or held-out perplexity, on a trained model."""

    source: str = setting(
        help="the model: a run directory, a training checkpoint (.ckpt), a safetensors file written by archlab or "
        "a Hugging Face directory (archlab-export's) (a bare path is taken as source)"
    )
    tasks: Optional[List[str]] = setting(
        None, "lm-eval tasks, e.g. [hellaswag,arc_easy] (they download their data) or local ones in include_path"
    )
    include_path: Optional[str] = setting(None, "a directory (or YAML file) of local lm-eval task configs")
    num_fewshot: Optional[int] = setting(None, "examples before each question; null = each task's own")
    limit: Optional[float] = setting(
        None, "per task, the first N examples (an integer) or that fraction of them (below 1); null = all"
    )
    batch_size: int = setting(8, "sequences per forward pass")
    device: str = setting("cpu", "cpu, cuda or cuda:<index>")
    prefix_token_id: Optional[int] = setting(
        None, "the id a text scored from its start is conditioned on; null = the tokenizer's EOS"
    )
    perplexity: Optional[str] = setting(
        None, "instead of tasks: held-out perplexity of a UTF-8 text file or a shard directory (its val.bin)"
    )
    seq_len: Optional[int] = setting(None, "perplexity: tokens per window; null = model.context_length")
    stride: Optional[int] = setting(
        None,
        "perplexity: tokens between window starts (each token scored once, with up to seq_len before it); "
        "null = seq_len",
    )
    document_mask: bool = setting(
        False, "perplexity on shards: attention within documents (meta.json's eos_id), as data.document_mask"
    )
    reset_positions: bool = setting(False, "perplexity on shards: positions restart per document (document_mask)")
    out: Optional[str] = setting(
        None, "the directory results.json goes into; null = the run's eval/ (beside the model outside a run)"
    )

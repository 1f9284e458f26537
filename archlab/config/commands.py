"""Schemas of the commands other than archlab-train: archlab-check, archlab-bench, archlab-generate and
archlab-prepare (plain dataclasses; the Hydra ones are stored by ``archlab.config.store``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from archlab.config.model import ModelConfig


@dataclass
class CheckConfig:
    """``archlab-check``: one composed model, or (with no ``model=``) every preset."""

    model: ModelConfig = field(default_factory=ModelConfig)
    format: str = "table"  # table | json


@dataclass
class BenchConfig:
    """``archlab-bench``: one composed model against the Hugging Face implementation of its layout."""

    model: ModelConfig = field(default_factory=ModelConfig)
    batch_size: int = 8
    seq_len: Optional[int] = None
    warmup: int = 2
    repeats: int = 10
    generate_tokens: Optional[int] = None  # None: model.context_length minus the 8-token prompt
    device: str = "auto"
    dtype: str = "float32"
    threads: Optional[int] = None
    compare_hf: bool = True
    compile: bool = False
    matmul_size: Optional[int] = None
    checkpointing: bool = True
    format: str = "table"


@dataclass
class GenerateConfig:
    """``archlab-generate``: a saved model, a prompt and how to sample its continuation."""

    ckpt: Optional[str] = None  # safetensors file written by archlab.weights.save_weights
    prompt: Optional[str] = None  # text, encoded with the tokenizer stored in the file
    prompt_ids: Optional[List[int]] = None  # token ids, for files without a tokenizer
    max_new_tokens: int = 100
    temperature: float = 1.0  # 0 = greedy
    top_k: Optional[int] = None  # sample among the k most likely tokens; null = all
    seed: Optional[int] = 0  # null = a different sample every run
    device: str = "cpu"


@dataclass
class PrepareConfig:
    """``archlab-prepare``: tokenise a text file into shards for ``data=tokens``."""

    input: str = "???"
    output: str = "???"
    tokenizer: str = "char"  # char | byte | bpe
    vocab_size: Optional[int] = None  # bpe only: the vocabulary to train
    val_fraction: float = 0.1  # the last 10% of the tokens is the validation split

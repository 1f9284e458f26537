"""archlab-average: the elementwise mean of a run's last k checkpoints (by step), written as a safetensors
file with the run's model config and tokenizer, which archlab-eval, archlab-export and archlab-generate read.

    archlab-average outputs/recall last=3                         # writes outputs/recall/model_last3.safetensors
    archlab-average outputs/recall last=5 out=averaged.safetensors

A run keeps its best and last checkpoints by default; train with callbacks.checkpoint.keep=all (and
callbacks.checkpoint.every_n_train_steps=N) to keep every one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from archlab.cli.errors import short_config_errors
from archlab.cli.settings import settings_or_help
from archlab.config.commands import AverageConfig
from archlab.errors import ConfigError
from archlab.run_files import AVERAGE_EXPORT


def output_path(cfg: AverageConfig) -> Path:
    """Where the average goes: ``out``, a .safetensors file in a writable directory, or the run's own file."""
    from archlab import checks

    if cfg.out is None:
        return Path(cfg.run).expanduser() / AVERAGE_EXPORT.format(k=cfg.last)
    if not cfg.out.endswith(".safetensors"):
        raise ConfigError("out", cfg.out, "null or a path ending in .safetensors")
    checks.writable_dir("out", Path(cfg.out).expanduser().parent)
    return Path(cfg.out).expanduser()


@short_config_errors
def main(argv: Optional[Sequence[str]] = None) -> None:
    cfg = settings_or_help("archlab-average", __doc__, AverageConfig, sys.argv[1:] if argv is None else argv, "run")
    if cfg is None:
        return
    # torch and the checkpoints: only when there is work
    from archlab.build import build_model
    from archlab.interop.export import read_source
    from archlab.training.average import last_checkpoints, mean_weights
    from archlab.weights import TOKENIZER_KEY, save_weights

    paths = last_checkpoints(cfg.run, cfg.last)
    out = output_path(cfg)
    _, config, tokenizer = read_source(str(paths[-1]), "run")  # the run's model config and tokenizer
    model = build_model(config)
    model.load_state_dict(mean_weights(paths), strict=True)
    meta = {TOKENIZER_KEY: json.dumps(tokenizer.to_dict())} if tokenizer is not None else None
    save_weights(model, out, metadata=meta)
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {out}")


if __name__ == "__main__":
    main()

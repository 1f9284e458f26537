"""archlab-export: a trained model and its tokenizer as a Hugging Face directory, which
transformers' AutoModelForCausalLM and AutoTokenizer load.

    archlab-export outputs/shakespeare out=hf/shakespeare                  # a run: its model.safetensors
    archlab-export outputs/shakespeare/checkpoints/last.ckpt out=hf/last    # a checkpoint, the run's tokenizer
    archlab-export model.safetensors format=hf out=hf/model
    archlab-export outputs/moe out=hf/moe family=qwen3_5_moe_text         # one of the classes holding the layout

A run directory exports the final weights it wrote (model.safetensors, as archlab-generate reads them).
Every setting, the layout's Hugging Face class and the tokenizer are checked before any weights are read.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from archlab.cli.errors import short_config_errors
from archlab.cli.settings import settings_or_help
from archlab.config.commands import ExportConfig


@short_config_errors
def main(argv: Optional[Sequence[str]] = None) -> None:
    cfg = settings_or_help("archlab-export", __doc__, ExportConfig, sys.argv[1:] if argv is None else argv, "source")
    if cfg is None:
        return
    from archlab.interop.export import export_hf, plan_export  # torch and the converters: only when there is work

    plan = plan_export(cfg.source, cfg.format, cfg.out, cfg.family)
    out = export_hf(plan)
    print(
        f"wrote {plan.model_class} and its {plan.tokenizer.kind} tokenizer to {out}\n"
        f'load it with: AutoModelForCausalLM.from_pretrained("{out}"), AutoTokenizer.from_pretrained("{out}")'
    )


if __name__ == "__main__":
    main()

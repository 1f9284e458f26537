"""archlab-interop: which Hugging Face classes archlab converts both ways (and the archlab parts each maps
to), which causal-LM classes it refuses and the part each needs, or whether one checkpoint's config loads.

    archlab-interop                          # both tables; exit 0
    archlab-interop format=markdown          # as docs/interop.md holds them
    archlab-interop path/to/hf_checkpoint    # loads as which family, or the refusal (exit 1)
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from archlab.cli.errors import short_config_errors
from archlab.cli.settings import settings_or_help
from archlab.config.commands import InteropConfig
from archlab.errors import ConfigError
from archlab.interop.listing import config_verdict, listing

FORMATS = ("text", "markdown", "json")


@short_config_errors
def main(argv: Optional[Sequence[str]] = None) -> None:
    cfg = settings_or_help("archlab-interop", __doc__, InteropConfig, sys.argv[1:] if argv is None else argv, "config")
    if cfg is None:
        return
    if cfg.format not in FORMATS:
        raise ConfigError("format", cfg.format, f"one of {list(FORMATS)}")
    if cfg.config is None:
        print(listing(cfg.format))
        return
    loads, verdict = config_verdict(cfg.config)
    print(f"{cfg.config}: {verdict}")
    if not loads:
        sys.exit(1)


if __name__ == "__main__":
    main()

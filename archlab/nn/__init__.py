"""The decoder's parts, one registry family per file. Importing any of them imports the modules that
register entries into another module's registry (``rope`` into ``POSITIONS``, ``mla``,
``gated_deltanet`` and ``mamba2`` into ``ATTENTIONS``, ``moe`` into ``MLPS``), so every registry is whole whichever
module a caller reaches first."""

from archlab.nn import deltanet, latent, mamba2, moe, rope

__all__ = ["deltanet", "latent", "mamba2", "moe", "rope"]

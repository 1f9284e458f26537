"""The decoder's parts, one registry family per file (the token mixers, one per file, in the ``mixers``
package; the residual streams in ``streams``). Importing any of them imports the modules that register
entries into another module's registry (``rope`` into ``POSITIONS``, every mixer into ``MIXERS``, ``moe``,
``channel_mix``, ``xielu`` and ``ngpt_mlp`` into ``MLPS``, ``normed_skip`` and ``ngpt`` into ``BLOCKS``,
``ngpt_head`` into ``HEADS``), so every registry is whole
whichever module a caller reaches first."""

from archlab.nn import channel_mix, mixers, moe, ngpt, ngpt_head, ngpt_mlp, normed_skip, rope, streams, xielu

__all__ = [
    "channel_mix",
    "mixers",
    "moe",
    "ngpt",
    "ngpt_head",
    "ngpt_mlp",
    "normed_skip",
    "rope",
    "streams",
    "xielu",
]

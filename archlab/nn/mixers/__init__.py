"""Token mixers, one module each, registered in ``MIXERS`` (``base.py``: the interface, the KV cache or
state and the masks); their numerical forms live in ``ops/``. A new mixer is a module here and its
import below."""

from archlab.nn.mixers import attention, gated_deltanet, mamba2, mla

__all__ = ["attention", "gated_deltanet", "mamba2", "mla"]

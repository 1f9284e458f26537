"""The residual streams between blocks (``model.stream``): the registry and its entries, one per file;
importing this package registers them all."""

from archlab.nn.streams import altup, gated, hyper, mhc, plain  # noqa: F401  (registers the entries)
from archlab.nn.streams.base import STREAMS, Stream, build_stream

__all__ = ["STREAMS", "Stream", "build_stream"]

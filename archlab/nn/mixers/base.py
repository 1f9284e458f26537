"""The token-mixer interface every mixer implements (``Mixer``, registered in ``MIXERS`` under
``model.attention.kind``), the head sizes other families ask of the chosen mixer, and what the mixers
share at run time: the KV cache (keys and values, or a recurrent mixer's constant-size state), the
attention masks and the scores' entropy and largest logit that per-layer health reads."""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple, Optional, Sequence

import torch
from torch import Tensor, nn

from archlab.config import ModelConfig
from archlab.config.layers import layer_configs
from archlab.nn.component import LayerPart
from archlab.nn.positions import Rotation
from archlab.registry import Registry


class Tokens(NamedTuple):
    """What a recurrent mixer is told of its new positions, each ``[B, T]`` bool or None: ``present``, which
    are tokens (False: padding; None: all are); ``starts``, where a packed document begins (its state and
    its convolution's window start empty there, as for the document alone; None: nowhere)."""

    present: Optional[Tensor] = None
    starts: Optional[Tensor] = None


class Mixer(LayerPart, nn.Module):
    """A token mixer, built per layer as ``Entry(cfg, layer)`` (a layer knows its ``window``) and
    called as ``attn(x, rotary, mask, cache, layer)``. Beside the Component members it answers what the
    other families ask of a mixer: its head sizes (``qk_head_dim``, ``rotary_head_dim``), whether a rotary
    scheme acts in it (``takes_rotary``) and what it needs of the scheme's fields (``validate_rotary``), the
    KV cache's size (``kv_cache_values``), and where it has softmax scores their entropy and largest logit
    (``score_stats``)."""

    # False: it mixes by scores over the keys and takes the attention mask (with any score bias), or None.
    # True: a recurrent mixer; its mask is a Tokens (its new positions' padding and document starts), or None
    recurrent: ClassVar[bool] = False
    window: Optional[int] = None  # keys a query sees (None: every earlier one)
    chunk: Optional[int] = None  # a query sees only the keys of its own chunk of this many positions (None: no chunks)

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()

    def forward(
        self,
        x: Tensor,
        rotary: Optional[Rotation] = None,
        mask: Optional[Tensor] = None,
        cache: Optional[KVCache] = None,
        layer: int = 0,
    ) -> Tensor:
        raise NotImplementedError

    def score_stats(self, x: Tensor, rotary: Optional[Rotation] = None, mask: Any = None) -> Optional[ScoreStats]:
        """For the input ``x`` ``[B, T, d]`` of a training forward (no cache) with its ``rotary`` and ``mask``,
        the entropy and largest logit of this mixer's softmax scores (``scores_of``); None: it has no scores
        (a recurrent mixer), or none this measures."""
        return None

    @classmethod
    def mask_of(cls, scores: Optional[Tensor], tokens: Optional[Tokens]) -> Any:
        """The mask this mixer takes, of the two the decoder derives: the attention mask ``scores`` (with any
        score bias), or for a recurrent mixer ``tokens``; a mixer running both side by side takes both."""
        return tokens if cls.recurrent else scores

    @staticmethod
    def qk_head_dim(cfg: ModelConfig) -> int:
        """Query/key dims per head: what a query and a key multiply over, and 1/sqrt of it the default scale."""
        raise NotImplementedError

    @classmethod
    def rotary_head_dim(cls, cfg: ModelConfig) -> int:
        """Dims per head a rotary scheme may rotate: all of them unless the entry says otherwise."""
        return cls.qk_head_dim(cfg)

    @staticmethod
    def validate_rotary(cfg: ModelConfig) -> None:
        """Raise ``ConfigError`` where the rotary scheme's fields ask what this attention cannot rotate
        (RoPE's ``validate`` calls it)."""

    @classmethod
    def takes_rotary(cls) -> bool:
        """Whether a rotary scheme rotates this mixer's queries and keys: not a recurrent mixer's (the
        recurrence orders its tokens, no position reaches it), so RoPE fits its dims to no head of it."""
        return not cls.recurrent

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """Values the KV cache of layer ``layer`` holds for one sequence of ``length`` tokens."""
        raise NotImplementedError


MIXERS: Registry[type[Mixer]] = Registry("model.attention.kind", base=Mixer)


def head_dim(cfg: ModelConfig) -> int:
    """Query/key dims per head of the chosen attention (mla: the un-rotated and the rotated part together)."""
    return MIXERS.get(cfg.attention.kind).qk_head_dim(cfg)


def split_head_dim(cfg: ModelConfig) -> int:
    """``attention.head_dim``, else d_model / n_head: a softmax mixer's heads splitting the width."""
    a = cfg.attention
    return a.head_dim if a.head_dim is not None else cfg.d_model // a.n_head


def rotary_head_dim(cfg: ModelConfig) -> int:
    """Dims per head of the chosen attention that a rotary scheme may rotate: all, or mla's rotated part."""
    return MIXERS.get(cfg.attention.kind).rotary_head_dim(cfg)


def window_of(cfg: ModelConfig) -> Optional[int]:
    """The sliding window of ``cfg``'s mixer (None: every earlier key, or a mixer without keys)."""
    return getattr(cfg.attention, "window", None)


def chunk_of(cfg: ModelConfig, layer: int) -> Optional[int]:
    """The attention chunk of ``layer`` (None: unchunked, or a mixer without keys): ``attention.chunk``."""
    return getattr(cfg.attention, "chunk", None)


def positions_seen(cfg: ModelConfig, length: int, layer: int) -> int:
    """Positions the last of ``length`` queries of ``layer`` attends to: all ``length`` in a global layer,
    at most the window in a sliding one, at most the chunk in a chunked one (what the KV cache holds and
    the scores cost)."""
    span = window_of(cfg) or chunk_of(cfg, layer)  # validation allows one of the two
    return length if span is None else min(span, length)


class Snapshot(NamedTuple):
    """A KV cache as it was (``KVCache.snapshot``): its length, its six lists, its passes' snapshots."""

    length: int
    lists: tuple[list[Any], ...]
    passes: dict[int, Snapshot]


class KVCache:
    """What attention keeps of every layer for a batch, decoded up to ``max_len`` positions: two tensors
    per layer, ``k`` and ``v``, each ``[B, heads, T, dim]`` (causal: keys and values; mla: its latent and
    its shared rotated key), allocated on a layer's first update in the shapes it hands over. A global
    layer keeps every position; a sliding-window layer keeps only the last ``window - 1``, all a later
    query can see, and a chunked one the last ``chunk - 1``, which hold its chunk. A recurrent layer
    (gated_deltanet, mamba2) keeps instead two tensors of a size constant in the length, which it reads and
    replaces itself: ``conv_state`` (its convolution's last inputs) and ``recurrent_state`` (its states).
    A layer that runs attention and a recurrence side by side (``parallel``) keeps both, in its own slots
    of the four lists, each part as it would alone. A ``stateful`` MLP (RWKV's channel-mix, which reads the
    token before) keeps its layer's last input in ``shift``; a layer's n-gram input (``model.ngram_input``) its
    last tokens and convolution inputs in ``ngram``. Each later pass of a looped layer
    (``model.layers.loop``) keeps its own in a cache of its own, ``of_pass``.
    ``dtype`` (default: the first tensors') is the one they are stored in; ``layers`` the config of each
    slot where they are not the model's layers (a multi-token prediction module's block numbered after them).

    Every tensor a layer hands over replaces the one before it, but for a global layer's, written in place
    past ``length``: so ``snapshot`` (the lists, the length and the passes' caches) and ``restore`` take
    decoding back to a position, as speculative decoding does after rejecting drafts."""

    def __init__(
        self,
        cfg: ModelConfig,
        batch_size: int,
        max_len: int,
        dtype: Optional[torch.dtype] = None,
        layers: Optional[Sequence[ModelConfig]] = None,
    ):
        self.cfg, self.batch_size, self.max_len, self.dtype = cfg, batch_size, max_len, dtype
        configs = layer_configs(cfg) if layers is None else list(layers)
        # a chunked layer keeps the window of its chunk: with left padding each row's chunks start elsewhere
        self.windows = [window_of(c) or chunk_of(c, layer) for layer, c in enumerate(configs)]
        # the model's shared-block uses (model.layers.shared), each its keys and values after the layers'
        self.windows += [None] * (len(cfg.layers.shared.layers) if layers is None else 0)
        slots = len(self.windows)
        self.k: list[Optional[Tensor]] = [None] * slots
        self.v: list[Optional[Tensor]] = [None] * slots
        self.conv_state: list[Optional[Tensor]] = [None] * slots
        self.recurrent_state: list[Optional[Tensor]] = [None] * slots
        self.shift: list[Optional[Tensor]] = [None] * slots  # a stateful MLP's last input [B, d]
        self.ngram: list[Optional[Any]] = [None] * slots  # an n-gram input's NGramState (model.ngram_input)
        self.length = 0  # positions already seen; advanced by the model after each forward
        self.passes: dict[int, KVCache] = {}  # a looped layer's later passes' caches, by pass (of_pass)

    def of_pass(self, index: int) -> KVCache:
        """The cache pass ``index`` of a looped layer reads and writes (0: this one): a cache of its own for a
        later pass, made empty on its first use, at this one's length."""
        if index == 0:
            return self
        cache = self.passes.get(index)
        if cache is None:
            cache = self.passes[index] = KVCache(self.cfg, self.batch_size, self.max_len, self.dtype)
        cache.length = self.length
        return cache

    def snapshot(self) -> Snapshot:
        """What ``restore`` takes decoding back to: the length, every layer's tensors as they are now and
        the looped passes' caches likewise."""
        lists = (self.k, self.v, self.conv_state, self.recurrent_state, self.shift, self.ngram)
        return Snapshot(
            self.length, tuple(list(held) for held in lists), {p: c.snapshot() for p, c in self.passes.items()}
        )

    def restore(self, snapshot: Snapshot) -> None:
        """Decoding back where ``snapshot`` was taken: what was cached since is forgotten."""
        self.length = snapshot.length
        self.k, self.v, self.conv_state, self.recurrent_state, self.shift, self.ngram = (
            list(t) for t in snapshot.lists
        )
        self.passes = {p: c for p, c in self.passes.items() if p in snapshot.passes}  # a pass begun since: none
        for p, taken in snapshot.passes.items():
            self.passes[p].restore(taken)

    def truncatable(self) -> bool:
        """Whether lowering ``length`` alone forgets the last positions: every layer keeps all its keys and
        values in place (no window, chunk, recurrent state or stateful MLP), so nothing else moved."""
        states = (*self.conv_state, *self.recurrent_state, *self.shift, *self.ngram)
        held = all(w is None for w in self.windows) and all(t is None for t in states)
        return held and all(c.truncatable() for c in self.passes.values())

    def kept(self, window: Optional[int]) -> int:
        """How many cached positions a layer with this window (or chunk) attends to besides the new ones."""
        return self.length if window is None else min(self.length, window - 1)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store this step's two tensors ``[B, heads, T, dim]`` of ``layer`` after the cached ones; return
        what this step attends to (for a window or chunked layer: the kept positions, then the new ones)."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; this step needs {end}")
        window = self.windows[layer]
        cached_k, cached_v = self.k[layer], self.v[layer]  # both None until the layer's first update
        if window is None:
            if cached_k is None or cached_v is None:
                cached_k, cached_v = self._empty(k), self._empty(v)
                self.k[layer], self.v[layer] = cached_k, cached_v
            cached_k[:, :, self.length : end] = k
            cached_v[:, :, self.length : end] = v
            return cached_k[:, :, :end], cached_v[:, :, :end]
        if cached_k is not None and cached_v is not None:
            k, v = torch.cat((cached_k, k), dim=2), torch.cat((cached_v, v), dim=2)
        keep = min(k.shape[2], window - 1)
        self.k[layer], self.v[layer] = k[:, :, k.shape[2] - keep :], v[:, :, v.shape[2] - keep :]
        return k, v

    def _empty(self, t: Tensor) -> Tensor:
        """Room for ``max_len`` positions of tensors shaped like ``t``, zeroed."""
        shape = (self.batch_size, t.shape[1], self.max_len, t.shape[3])
        return torch.zeros(shape, device=t.device, dtype=self.dtype or t.dtype)


def attention_mask(
    q_pos: Tensor,
    k_pos: Tensor,
    bias: Optional[Tensor],
    window: Optional[int] = None,
    always: bool = False,
    chunk: Optional[int] = None,
) -> Optional[Tensor]:
    """What attention needs beyond plain causal masking, for queries at ``q_pos`` and keys at the
    contiguous positions ``k_pos`` (ending at the last query): None when ``is_causal`` (or one query
    seeing every key) suffices (unless ``always``), else a boolean mask of visible keys, or ``bias`` with
    -inf where a key is hidden. A key is hidden when it is later than the query, ``window`` or more
    positions before it, or in another ``chunk`` (⌊position / chunk⌋ differs: Llama 4; the caller passes
    a chunk only where the keys span two, as it knows their first position without a device sync)."""
    cut = window is not None and len(k_pos) > window  # some key lies outside some query's window
    if bias is None and not (cut or always) and chunk is None and (len(q_pos) == 1 or len(q_pos) == len(k_pos)):
        return None
    distance = q_pos[:, None] - k_pos[None, :]
    visible = distance >= 0
    if cut and window is not None:  # cut implies a window
        visible &= distance < window
    if chunk is not None:
        visible &= q_pos[:, None] // chunk == k_pos[None, :] // chunk
    return visible if bias is None else bias.masked_fill(~visible, float("-inf"))


def visible_keys(mask: Optional[Tensor], queries: int, keys: int, device: torch.device) -> Tensor:
    """``mask`` as given, or where it is None (plain causal, the queries ending with the keys) that
    causal mask as a boolean ``[queries, keys]``."""
    if mask is not None:
        return mask
    return torch.ones(queries, keys, dtype=torch.bool, device=device).tril(keys - queries)


def key_visibility(mask: Optional[Tensor], queries: int, keys: int, device: torch.device) -> Tensor:
    """The keys each query sees, bool ``[B, T, S]`` or ``[T, S]``, of ``mask`` as ``Mixer.forward`` takes it: bool
    or a bias (-inf where hidden), per row ``[B, 1 or H, T, S]`` or per head ``[H, T, S]`` (ALiBi's bias of a
    batch without padding); every head hides the same keys."""
    visible = visible_keys(mask, queries, keys, device)
    visible = visible if visible.dtype == torch.bool else visible > float("-inf")
    if visible.dim() == 4:
        return visible[:, 0]
    return visible[0] if visible.dim() == 3 else visible


def narrow(chosen: Tensor, mask: Optional[Tensor]) -> Tensor:
    """The mask of the ``chosen`` keys ``[B, T, S]`` (within those ``mask`` shows): bool, or ``mask``'s bias
    where chosen (an indexer's choice: dsa's, qsa's)."""
    if mask is None or not mask.is_floating_point():
        return chosen[:, None]
    return torch.where(chosen[:, None], mask, float("-inf"))


SAMPLED_QUERIES = 64  # score_stats reads at most this many queries per sequence


class ScoreStats(NamedTuple):
    """A mixer's attention scores summarised (0-dim float32): ``entropy``, the mean over batch rows, heads
    and the sampled queries of the softmax's entropy in nats; ``max_logit``, the largest logit it saw."""

    entropy: Tensor
    max_logit: Tensor


def scores_of(
    q: Tensor,
    k: Tensor,
    mask: Optional[Tensor],
    scale: float,
    softcap: Optional[float] = None,
    sinks: Optional[Tensor] = None,
) -> ScoreStats:
    """``ScoreStats`` of the softmax attention of queries ``q`` ``[B, H, T, d]`` over keys ``k``
    ``[B, KV, T, d]`` (KV divides H) of the same T positions, in float32, as the forward's softmax sees
    them: ``q·k·scale``, soft-capped to ``softcap·tanh(s / softcap)``, then ``mask`` as ``Mixer.forward``
    takes it (None: causal; boolean; or a bias with -inf, ALiBi's), and each head's sink as one more
    logit. Only every ⌈T / SAMPLED_QUERIES⌉-th query counting back from the last is read; a query that
    sees no key (padding) is left out."""
    T = q.shape[2]
    every = -(-T // SAMPLED_QUERIES)  # ⌈T / SAMPLED_QUERIES⌉
    rows = torch.arange(T - 1, -1, -every, device=q.device)
    B, H, KV, Q = q.shape[0], q.shape[1], k.shape[1], len(rows)
    q = q[:, :, rows].float().reshape(B, KV, H // KV * Q, -1) * scale  # each key head's group of query heads
    scores = (q @ k.float().transpose(-2, -1)).view(B, H, Q, T)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    visible = visible_keys(mask, T, T, q.device)[..., rows, :]
    scores = scores.masked_fill(~visible, float("-inf")) if visible.dtype == torch.bool else scores + visible.float()
    if sinks is not None:
        scores = torch.cat((scores, sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)), dim=-1)
    p = scores.softmax(dim=-1)  # NaN in a row with no key seen
    entropy = -torch.xlogy(p, p).sum(-1)
    valid = entropy.isfinite()
    return ScoreStats(entropy.nan_to_num().sum() / valid.sum(), scores.max())


def build_mixer(cfg: ModelConfig, layer: int = 0) -> Mixer:
    """The chosen mixer of layer ``layer``, built from that layer's config."""
    return MIXERS.get(cfg.attention.kind)(cfg, layer)

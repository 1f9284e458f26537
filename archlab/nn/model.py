"""The decoder: token embedding (-> projection in -> its norm) -> position scheme (-> widened into residual
streams) -> blocks (-> streams merged) -> final norm (-> projection out) -> head; before some blocks, any
shared-block uses (``nn/shared.py``), added to their input; beside the head, any multi-token prediction
modules (``nn/mtp.py``), trained through ``forward``'s ``targets``."""

from __future__ import annotations

import math
from typing import Callable, Iterable, Optional, Sequence, cast

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from archlab.config import ModelConfig, embedding_dropout
from archlab.config.layers import layer_configs, layer_kind
from archlab.nn import bitlinear
from archlab.nn.block import BLOCKS, Block, build_block
from archlab.nn.component import Role, is_residual_projection
from archlab.nn.head import build_head, embedding_width
from archlab.nn.loop import Loop
from archlab.nn.loss import IGNORE, next_token_loss
from archlab.nn.mixers.attention import link_first_values
from archlab.nn.mixers.base import MIXERS, KVCache, Tokens, attention_mask, rotary_head_dim
from archlab.nn.mixers.shared_index import link_shared_index
from archlab.nn.mixers.shared_kv import link_shared_kv
from archlab.nn.moe import MoE
from archlab.nn.mtp import MTPModule, MultiTokenPrediction, mtp_layer
from archlab.nn.ngram_input import NGramInput
from archlab.nn.norms import build_norm
from archlab.nn.per_layer_inputs import PerLayerInputs
from archlab.nn.positions import POSITIONS, Position, Rotation, build_position, uninitialised_embedding
from archlab.nn.shared import build_shared
from archlab.nn.streams import build_stream


def document_ids(idx: Tensor, eos_id: int) -> Tensor:
    """Each token's document within its row ``[B, T]``, counted from 0: an EOS belongs to the document it
    ends (as OLMo-core and torchtitan mask), and the token after it starts the next one."""
    eos = (idx == eos_id).long()
    return eos.cumsum(-1) - eos


def document_starts(documents: Tensor) -> Tensor:
    """``[B, T]``: True where a document begins after another within the row (``document_ids``' ids change)."""
    starts = torch.zeros_like(documents, dtype=torch.bool)
    starts[..., 1:] = documents[..., 1:] != documents[..., :-1]
    return starts


def document_positions(documents: Tensor) -> Tensor:
    """Positions restarting at 0 at each document's first token, from ``document_ids``' ``[B, T]`` ids."""
    index = torch.arange(documents.shape[-1], device=documents.device)
    return index - torch.where(document_starts(documents), index, 0).cummax(-1).values


def document_inputs(idx: Tensor, eos_id: int, reset_positions: bool) -> dict[str, Tensor]:
    """``Decoder.forward``'s ``document_ids`` for packed rows of documents separated by ``eos_id``, and
    with ``reset_positions`` its ``position_ids``, restarting at each document."""
    documents = document_ids(idx, eos_id)
    return {"document_ids": documents, **({"position_ids": document_positions(documents)} if reset_positions else {})}


def row_positions(attention_mask: Optional[Tensor], position_ids: Optional[Tensor]) -> Optional[Tensor]:
    """Each row's positions ``[B, cached + T]`` where they are not the column index: ``position_ids``, or
    numbered from each row's first token by the attention mask (left padding)."""
    if position_ids is not None or attention_mask is None:
        return position_ids
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def query_positions(start: int, length: int, positions: Optional[Tensor], device: torch.device) -> Tensor:
    """The positions of the ``length`` new tokens after ``start`` cached ones: ``[T]``, or ``[B, T]`` by row."""
    return torch.arange(start, start + length, device=device) if positions is None else positions[:, start:]


def own_position(cfg: ModelConfig, layer: ModelConfig) -> bool:
    """Whether a layer of config ``layer`` needs a position module of its own rather than the model's: its
    scheme differs, or the scheme acts inside softmax attention and reads what differs in the layer's
    attention, its heads (ALiBi's slopes) or the dims it rotates (RoPE's frequencies: an mla layer among
    causal ones, a layer kind with another head_dim, a causal kind in a model whose own mixer is recurrent).
    A mixer that takes no rotation (a recurrent one) takes the model's, which it leaves unused."""
    if layer.position != cfg.position:
        return True
    if not MIXERS.get(layer.attention.kind).takes_rotary() or not POSITIONS.get(layer.position.kind).in_attention:
        return False
    return (layer.attention.n_head, rotary_head_dim(layer)) != (cfg.attention.n_head, rotary_head_dim(cfg))


class Decoder(nn.Module):
    """A decoder-only transformer assembled from the registries named in ``cfg``."""

    def __init__(self, cfg: ModelConfig, layers: Optional[Sequence[ModelConfig]] = None):
        """``layers``: each layer's config where the caller derived them already (``nn.validation.resolve``)."""
        super().__init__()
        self.cfg = cfg
        width = embedding_width(cfg)
        self.tok_emb = uninitialised_embedding(cfg.vocab_size, width)
        # embeddings narrower or wider than d_model (OPT-350m): bias-free projections in and out of d_model
        self.project_in = nn.Linear(width, cfg.d_model, bias=False) if cfg.embedding_dim is not None else None
        self.embedding_norm = build_norm(cfg) if cfg.embedding_norm else None  # on the looked-up rows (BLOOM)
        self.position = build_position(cfg)
        self.drop = nn.Dropout(embedding_dropout(cfg))  # on the embeddings entering the first block
        self.per_layer_inputs = PerLayerInputs(cfg) if cfg.per_layer_input.dim else None  # Gemma 4's PLE
        # hashed n-gram inputs before some blocks (model.ngram_input: Qwen4-Exp's PLE), by layer
        ngram = cfg.ngram_input.layers
        self.ngram_inputs = nn.ModuleDict({str(i): NGramInput(cfg, k) for k, i in enumerate(ngram)}) if ngram else None
        configs = list(layers) if layers is not None else layer_configs(cfg)  # a layer kind overrides the model's parts
        self.blocks = nn.ModuleList(build_block(c, i) for i, c in enumerate(configs))
        bitlinear.convert(self.blocks, cfg)  # model.linear: the blocks' projections BitLinear
        mixers = [b.attn for b in cast("Sequence[Block]", self.blocks)]
        link_first_values(mixers)  # value residual: layer 0's values
        link_shared_kv(mixers, configs)  # kv_shared layers: an earlier layer's keys and values
        link_shared_index(mixers, configs)  # index_shared dsa layers: an earlier indexer's choice
        # a layer kind with a position scheme of its own (rotary or score bias, no parameters) has its module
        own = {layer_kind(cfg, i): c for i, c in enumerate(configs) if own_position(cfg, c)}
        # multi-token prediction modules (model.head.mtp), their blocks of layer kind mtp.layer or the model's
        module_layer = mtp_layer(cfg) if cfg.head.mtp.depth else None
        self.mtp = None if module_layer is None else MultiTokenPrediction(cfg, module_layer)
        self.mtp_position = None
        if module_layer is not None and own_position(cfg, module_layer):
            self.mtp_position = cfg.head.mtp.layer
            own[self.mtp_position] = module_layer
        self.layer_positions = nn.ModuleDict({str(name): build_position(c) for name, c in own.items()})
        self.position_of = [k if k in own else None for k in (layer_kind(cfg, i) for i in range(cfg.n_layer))]
        self.shared = build_shared(cfg)  # weight-shared blocks before some layers (model.layers.shared)
        self.loop = Loop(cfg)  # the order the layers run in: a looped range again, pass after pass (model.layers.loop)
        self.stream = build_stream(cfg)  # several residual streams: widened after the embeddings, merged at the end
        self.final_norm = build_norm(cfg) if BLOCKS.get(cfg.block.kind).final_norm and cfg.block.final_norm else None
        self.project_out = nn.Linear(cfg.d_model, width, bias=False) if cfg.embedding_dim is not None else None
        self.head = build_head(cfg)
        self.head.tie(self.tok_emb)
        # Recompute each block's activations in backward instead of keeping them: less memory, more compute.
        self.activation_checkpointing = False

    def forward(
        self,
        idx: Tensor,
        cache: Optional[KVCache] = None,
        attention_mask: Optional[Tensor] = None,
        document_ids: Optional[Tensor] = None,
        position_ids: Optional[Tensor] = None,
        targets: Optional[Tensor] = None,
    ) -> Tensor:
        """Logits ``[B, T, vocab]`` for tokens ``idx`` ``[B, T]``; with ``cache``, continue after it.

        ``attention_mask`` ``[B, cached + T]`` (1 = a token, 0 = padding, as in Hugging Face) hides the
        padding from every query, and numbers each row's positions from its first token, so a
        left-padded prompt is computed as it would be alone. For packed rows without a cache,
        ``document_ids`` ``[B, T]`` keeps each query to the keys of its own document (a recurrent layer's
        state and convolution start empty at each document), and
        ``position_ids`` ``[B, T]`` replaces the positions (``document_positions``: restarting per document).
        ``targets`` ``[B, T]`` (the next tokens, ``IGNORE`` where unscored) has the multi-token prediction
        modules, where the model has them, compute their loss (``auxiliary_losses``); it is through
        ``forward`` that a sharded model gathers every weight."""
        h = self.hidden(idx, cache, attention_mask, document_ids, position_ids)
        if self.mtp is not None:
            self.mtp.aux_losses = {}
            if targets is not None:
                loss = self.mtp_loss(h, idx, targets, document_ids, position_ids)
                self.mtp.aux_losses["mtp_loss"] = (self.mtp.weight, loss)
        return self.logits(h)

    def logits(self, h: Tensor) -> Tensor:
        """The head's logits from the states it reads (``hidden``'s, or a multi-token prediction module's)."""
        return self.head(h if self.project_out is None else self.project_out(h))

    def embed(self, idx: Tensor) -> Tensor:
        """Token ids ``[B, T]`` as the first block's input before any position scheme: the table's rows,
        projected into d_model, normed and scaled where the layout says."""
        x = self.tok_emb(idx)
        if self.project_in is not None:
            x = self.project_in(x)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        if self.cfg.scale_embedding:  # sqrt(d_model) in float32, then rounded to x's dtype, as Gemma does
            x = x * torch.tensor(self.cfg.d_model**0.5, dtype=torch.float32).to(x.dtype)
        if self.cfg.embedding_multiplier != 1.0:  # a Python float, unrounded, as Granite multiplies
            x = x * self.cfg.embedding_multiplier
        return x

    def hidden(
        self,
        idx: Tensor,
        cache: Optional[KVCache] = None,
        attention_mask: Optional[Tensor] = None,
        document_ids: Optional[Tensor] = None,
        position_ids: Optional[Tensor] = None,
    ) -> Tensor:
        """What the head reads, ``[B, T, d_model]``: the last block's output merged from its streams and
        normed (``forward``'s arguments; ``forward`` is its logits)."""
        if (document_ids is not None or position_ids is not None) and cache is not None:
            raise ValueError("document_ids and position_ids are for whole packed rows, not cached decoding")
        start = cache.length if cache is not None else 0
        T = idx.shape[1]
        limit = self.position.max_positions
        if limit is not None and start + T > limit:  # checked on ints: no device sync, no graph break
            raise ValueError(
                f"position {start + T - 1} is past model.context_length={limit}: learned positions have "
                "no entry there; shorten the sequence or raise model.context_length"
            )
        positions = row_positions(attention_mask, position_ids)
        embedded = self.embed(idx)
        per_layer = None if self.per_layer_inputs is None else self.per_layer_inputs(idx, embedded)
        x = self.drop(self.position.embed(embedded, query_positions(start, T, positions, idx.device)))
        if self.stream is not None:
            x = self.stream.widen(x)
        blocks = cast("Sequence[Block]", self.blocks)
        walk = ((blocks[i], self.position_of[i], c) for i, c in self.loop.steps(blocks, cache))
        enter = self.loop.enter if self.loop.injected is not None else None  # input injection (Dory's)
        x = self.run(
            x, walk, cache, attention_mask, positions, document_ids, enter, embeddings=x, ids=idx, per_layer=per_layer
        )
        if cache is not None:
            cache.length += T
        if self.stream is not None:
            x = self.stream.merge(x)
        return x if self.final_norm is None else self.final_norm(x)

    def run(
        self,
        x: Tensor,
        layers: Iterable[tuple[Block, Optional[str], Optional[KVCache]]],
        cache: Optional[KVCache],
        attention_mask: Optional[Tensor],
        positions: Optional[Tensor],
        document_ids: Optional[Tensor],
        enter: Optional[Callable[[int, Tensor], Tensor]] = None,
        embeddings: Optional[Tensor] = None,
        ids: Optional[Tensor] = None,
        per_layer: Optional[Tensor] = None,
    ) -> Tensor:
        """``x`` ``[B, T, ...]`` through ``layers``, each block with the key of its position scheme in
        ``layer_positions`` (None for the model's) and the cache it reads, after ``cache``'s positions (its
        length): the rotations and masks each needs, computed once per scheme and window as they are first
        needed (``layers`` is walked once, as it runs: a loop's walk records each pass's losses after it);
        ``enter(step, x)``, where given, is the state the ``step``-th block reads (a loop's input injection).
        With the ``embeddings`` (the first block's input), a layer with a shared-block use first has the
        use's output added to its input (``nn/shared.py``). ``ids`` ``[B, T]``: the tokens ``x`` embeds,
        handed to a hash-routed MoE before its block runs. ``per_layer`` ``[B, T, L, p]``: each layer's own
        input (``model.per_layer_input``), which it adds last."""
        start = cache.length if cache is not None else 0
        T, device = x.shape[1], x.device
        q_pos = query_positions(start, T, positions, device)
        schemes = {None: self.position, **{k: cast(Position, p) for k, p in self.layer_positions.items()}}
        rotary: dict[Optional[str], Optional[Rotation]] = {}
        masks: dict[tuple[Optional[int], Optional[int], Optional[str]], Optional[Tensor]] = {}
        # a recurrent layer's mask: which of its new positions are tokens, and where packed documents start
        present = None if attention_mask is None else attention_mask[:, start : start + T].bool()
        starts = None if document_ids is None else document_starts(document_ids)
        tokens = None if present is None and starts is None else Tokens(present, starts)
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        context = (q_pos, cache, attention_mask, positions, document_ids)
        joined: dict[str, Optional[Tensor]] = {}  # the shared-block uses' mask, once computed
        for step, (block, k, layer_cache) in enumerate(layers):
            if enter is not None:
                x = enter(step, x)
            if k not in rotary:
                rotary[k] = schemes[k].rotary(q_pos, x.dtype, cached=cache is not None)
            scores = None
            if not block.attn.recurrent:
                w, c = block.attn.window, block.attn.chunk
                if (w, c, k) not in masks:
                    kept = cache.kept(w or c) if cache is not None else 0  # a chunk is cached as a window of it
                    masks[w, c, k] = self.mask(
                        schemes[k], start, T, kept, w, x.dtype, device, attention_mask, positions, c, document_ids
                    )
                scores = masks[w, c, k]
            mask = block.attn.mask_of(scores, tokens)
            extra = () if embeddings is None else self.shared_input(block.layer, x, embeddings, joined, context)
            if isinstance(block.mlp, MoE) and block.mlp.token_experts is not None:
                block.mlp.ids = ids  # the experts its table gives these tokens (kept for a recomputation)
            if self.ngram_inputs is not None and ids is not None and str(block.layer) in self.ngram_inputs:
                x = self.ngram_input(block.layer, x, ids, cache, present, starts)
            x = (
                checkpoint(block.through, x, rotary[k], mask, layer_cache, *extra, use_reentrant=False)
                if recompute
                else block.through(x, rotary[k], mask, layer_cache, *extra)
            )
            x = block.finish(x, None if per_layer is None else per_layer[:, :, block.layer])
        return x

    def ngram_input(
        self,
        layer: int,
        x: Tensor,
        ids: Tensor,
        cache: Optional[KVCache],
        present: Optional[Tensor],
        starts: Optional[Tensor],
    ) -> Tensor:
        """``x`` (the streams, or one) with layer ``layer``'s n-gram input added, after the tokens and
        convolution inputs its cache slot holds (where there is a cache: then updated); ``starts`` ``[B, T]``
        where packed documents begin."""
        assert self.ngram_inputs is not None
        module = cast(NGramInput, self.ngram_inputs[str(layer)])
        h = x if self.stream is not None else x.unsqueeze(2)
        added, state = module(h, ids, None if cache is None else cache.ngram[layer], present, starts)
        if cache is not None:
            cache.ngram[layer] = state
        return x + (added if self.stream is not None else added.squeeze(2))

    def shared_input(
        self,
        layer: int,
        x: Tensor,
        embeddings: Tensor,
        masks: dict[str, Optional[Tensor]],
        context: tuple[Tensor, Optional[KVCache], Optional[Tensor], Optional[Tensor], Optional[Tensor]],
    ) -> tuple[Tensor, ...]:
        """``(what the shared-block use before ``layer`` adds to its input,)``, or () where it has none;
        ``context``: ``run``'s query positions, cache, attention mask, positions and documents. The uses' mask
        (causal, padding and other documents hidden, no score bias) is kept in ``masks`` under "shared"."""
        if self.shared is None or layer not in self.shared.use_of:
            return ()
        q_pos, cache, padding, positions, documents = context
        if "shared" not in masks:
            start, T = (cache.length if cache is not None else 0), x.shape[1]
            kept = cache.kept(None) if cache is not None else 0
            unbiased = self.shared.unbiased
            masks["shared"] = self.mask(
                unbiased, start, T, kept, None, x.dtype, x.device, padding, positions, None, documents
            )
        return (self.shared(layer, x, embeddings, masks["shared"], q_pos, cache),)

    def mtp_loss(
        self,
        h: Tensor,
        idx: Tensor,
        targets: Tensor,
        document_ids: Optional[Tensor] = None,
        position_ids: Optional[Tensor] = None,
    ) -> Tensor:
        """The multi-token prediction modules' mean cross-entropy: module k reads ``h`` (k = 1) or module
        k − 1's states at positions ``i < T − k`` with the embedding of token ``idx[i + k]``, and predicts
        ``targets[i + k]``; a target past the position's document (packed rows) is not scored."""
        assert self.mtp is not None
        T, losses, state = idx.shape[1], [], h
        for k, module in enumerate(cast("Sequence[MTPModule]", self.mtp.depths), start=1):
            n = T - k
            if n <= 0:  # rows shorter than the depth: nothing left to predict
                break
            documents = None if document_ids is None else document_ids[:, :n]
            positions = None if position_ids is None else position_ids[:, :n]
            x = module.enter(self.embed(idx[:, k:]), state[:, :n])
            state = module.norm(
                self.run(x, [(module.block, self.mtp_position, None)], None, None, positions, documents)
            )
            wanted = targets[:, k:]
            if document_ids is not None:
                wanted = wanted.masked_fill(document_ids[:, k:] != documents, IGNORE)
            scored = (wanted != IGNORE).sum()
            losses.append(torch.where(scored > 0, next_token_loss(self.logits(state), wanted), 0.0))
        return torch.stack(losses).mean() if losses else h.new_zeros(())

    @staticmethod
    def mask(
        position: Position,
        start: int,
        length: int,
        kept: int,
        window: Optional[int],
        dtype: torch.dtype,
        device: torch.device,
        padding: Optional[Tensor] = None,
        positions: Optional[Tensor] = None,
        chunk: Optional[int] = None,
        documents: Optional[Tensor] = None,
    ) -> Optional[Tensor]:
        """The attention mask (and ``position``'s bias) of layers with this ``window``, for the ``length``
        queries from index ``start`` and the keys such a layer attends to: the ``kept`` cached ones, then
        the new ones. With ``padding`` (the attention mask, 0 = padding), ``positions`` or ``documents``
        (``[B, T]`` ids) the mask is per row ``[B, 1, Tq, Tk]``: padded keys and keys of another document
        are hidden (a padded query sees only itself, so no row is empty), and the bias and the ``chunk``
        (keys in the query's chunk of that many positions only) read each row's ``positions``, so a
        padded row or a document is chunked as it would be alone (as Hugging Face's chunked mask)."""
        first, end = start - kept, start + length
        q_idx = torch.arange(start, end, device=device)
        k_idx = q_idx if kept == 0 else torch.arange(first, end, device=device)
        if padding is None and positions is None and documents is None:
            bias = position.bias(q_idx, k_idx)
            crossed = chunk is not None and first // chunk != (end - 1) // chunk  # on ints: no device sync
            return attention_mask(
                q_idx, k_idx, None if bias is None else bias.to(dtype), window, chunk=chunk if crossed else None
            )
        visible = attention_mask(q_idx, k_idx, None, window, always=True)
        assert visible is not None  # always=True: a mask
        if padding is not None:
            visible = visible & padding[:, None, None, first:end].bool()
        if documents is not None:
            visible = visible & (documents[:, None, start:end, None] == documents[:, None, None, first:end])
        q_pos, k_pos = (q_idx, k_idx) if positions is None else (positions[:, start:end], positions[:, first:end])
        if chunk is not None:
            same = q_pos[..., :, None] // chunk == k_pos[..., None, :] // chunk
            visible = visible & (same if positions is None else same[:, None])
        visible = visible | (q_idx[:, None] == k_idx[None, :])
        bias = position.bias(q_pos, k_pos)
        return visible if bias is None else bias.to(dtype).masked_fill(~visible, float("-inf"))

    def compile_blocks(self) -> None:
        """``torch.compile`` each block in place (``compile=true`` in archlab-train and archlab-bench).
        Per block, not the whole model: every block runs the same compiled graph, so compile time does not
        grow with depth (docs/performance.md compares the two)."""
        for block in self.all_blocks():
            for module in block.modules():  # parts that must run eagerly (a mixture of experts' dispatch)
                if (exclude := getattr(module, "exclude_from_compile", None)) is not None:
                    exclude()
            block.compile()

    def all_blocks(self) -> list[Block]:
        """The model's blocks, then those of its multi-token prediction modules."""
        depths = [] if self.mtp is None else cast("Sequence[MTPModule]", self.mtp.depths)
        return [*cast("Sequence[Block]", self.blocks), *(m.block for m in depths)]

    def new_cache(self, batch_size: int, max_len: Optional[int] = None) -> KVCache:
        """An empty KV cache for ``batch_size`` sequences of up to ``max_len`` positions."""
        return KVCache(self.cfg, batch_size, max_len or self.cfg.context_length, self.tok_emb.weight.dtype)

    def param_roles(self) -> dict[str, Role]:
        """The μP roles of the parameters no entry holds (``Component.param_roles``), the multi-token
        prediction modules' projections among them (their norms and blocks are entries)."""
        mtp = {f"mtp.depths.{k}.eh_proj.weight": Role.HIDDEN for k in range(self.cfg.head.mtp.depth)}
        shared = {} if self.shared is None else {f"shared.{n}": r for n, r in self.shared.param_roles().items()}
        ple = {f"per_layer_inputs.{n}": r for n, r in PerLayerInputs.param_roles().items()}
        return {
            **shared,
            "tok_emb.weight": Role.INPUT,
            "project_in.weight": Role.HIDDEN,
            "project_out.weight": Role.HIDDEN,
            **mtp,
            **ple,
        }

    @torch.no_grad()
    def init_weights(self, residual_depth: Optional[int] = None) -> None:
        """GPT-2 init: N(0, init_std) for matrices and tables (the tables, a tied head's among them,
        N(0, embedding_init_std) where set), zero biases, unit norm scales, and residual output projections
        scaled by 1/sqrt(2·n_layer) (Radford et al. 2019) or 1/sqrt(2·``model.residual_init_depth``), or by
        1/sqrt(2·``residual_depth``) (CompleteP: the proxy's depth, its residual branches scaled instead)."""
        std = self.cfg.init_std
        table_std = std if self.cfg.embedding_init_std is None else self.cfg.embedding_init_std
        tables = {id(m.weight) for m in self.modules() if isinstance(m, nn.Embedding)}  # a tied head's too
        fixed = self.cfg.residual_init_depth
        depth = residual_depth or fixed or self.cfg.n_layer
        for module in self.modules():
            if isinstance(module, nn.Linear):
                scale = 1 / math.sqrt(2 * depth) if is_residual_projection(module) else 1.0
                nn.init.normal_(module.weight, 0.0, table_std if id(module.weight) in tables else std * scale)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, table_std)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                module.reset_parameters()
            elif (init := getattr(module, "init_parameters", None)) is not None:
                init(std, std / math.sqrt(2 * depth))  # parameters held outside any Linear (stacked experts)
        bitlinear.ternarise(self)  # model.linear offline: the drawn weights held ternary, with their scales

    def auxiliary_losses(self) -> dict[str, tuple[float, Tensor]]:
        """name -> (weight, loss) of the auxiliary training losses the layers computed in the latest
        forward (a mixture of experts' load balance and router z-loss, dsa's indexer loss, the multi-token
        prediction modules' loss), each the mean over the layers that computed it (a looped layer's: over its
        passes; the modules' blocks among them where they ran); the training loss adds weight·loss."""
        per_layer: dict[str, list[tuple[float, Tensor]]] = {}
        ran = self.blocks if self.mtp is None or not self.mtp.aux_losses else self.all_blocks()  # modules run too
        latest = [getattr(part, "aux_losses", {}) for block in ran for part in (block.attn, block.mlp)]
        modules = [] if self.mtp is None else [self.mtp.aux_losses]
        for losses in (*self.loop.earlier_losses, *latest, *modules):
            for name, pair in losses.items():
                per_layer.setdefault(name, []).append(pair)
        return {
            name: (pairs[0][0], torch.stack([loss for _, loss in pairs]).mean()) for name, pairs in per_layer.items()
        }

"""Residual wiring of one transformer block: ``pre``, ``post``, ``parallel``, ``post_sublayer``, ``sandwich``."""

from __future__ import annotations

import math
from typing import ClassVar, Optional

import torch
from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig
from archlab.errors import ConfigError
from archlab.nn import laurel
from archlab.nn.component import LayerPart, Role
from archlab.nn.mixers.base import KVCache, build_mixer
from archlab.nn.mlp import MLPS, build_mlp
from archlab.nn.norm_gate import NormGate
from archlab.nn.norms import NORMS, build_norm
from archlab.nn.per_layer_inputs import PerLayerGate
from archlab.nn.positions import Rotation
from archlab.nn.streams.base import build_connection, build_layer_connection
from archlab.registry import Registry


class Block(LayerPart, nn.Module):
    """Holds a block's parts; subclasses say how they are wired into the residual stream. Built per
    layer as ``Entry(cfg, layer)``; its own parameters are its norms (``num_params``), its attention and
    MLP count as theirs. Every wiring multiplies what a sublayer adds to the residual stream by
    ``residual_multiplier`` (``into_residual``) and joins it by ``residual_rule`` (``residual_add``). Where
    the MLP entry is not ``present`` (kind none) the block holds no MLP and none of the norms before or
    after it, and its MLP step adds nothing. Beside the Component members: ``norms_per_block`` and
    ``final_norm``."""

    final_norm: ClassVar[bool] = True  # does the model need a norm after the last block?

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        names = self.held_norms(cfg)
        self.attn_norm = build_norm(cfg) if "attn_norm" in names else None  # before attention (or after, post)
        self.attn = build_mixer(cfg, layer)
        self.mlp_norm = build_norm(cfg) if "mlp_norm" in names else None
        self.mlp = build_mlp(cfg, layer) if MLPS.get(cfg.mlp.kind).present else None  # None: mlp kind none
        self.attn_out_norm = build_norm(cfg) if "attn_out_norm" in names else None  # on attention's output
        self.mlp_out_norm = build_norm(cfg) if "mlp_out_norm" in names else None
        self.drop = nn.Dropout(cfg.dropout)
        self.residual_multiplier = cfg.block.residual_multiplier
        self.depth_scaled = cfg.block.residual_rule == "depth"
        # each sublayer's connection to the residual streams (model.stream); None: one plain stream, x + f(x)
        self.attn_stream = build_connection(cfg, 2 * layer)
        self.mlp_stream = build_connection(cfg, 2 * layer + 1) if self.mlp is not None else None
        # or one connection around the whole block, which runs on one of the streams (AltUp's); None: none
        self.layer_stream = build_layer_connection(cfg, layer)
        # after the sublayers (``finish``): the layer's per-layer input through its gate, then the layer scalar
        self.per_layer_input = PerLayerGate(cfg) if cfg.per_layer_input.dim else None
        # beside attention, a low-rank branch of its normed input joining the stream after its add (LAuReL)
        self.laurel = laurel.Laurel(cfg) if cfg.block.laurel_rank else None
        self.layer_scalar: Optional[Tensor]
        self.register_buffer("layer_scalar", torch.ones(1) if cfg.block.layer_scalar else None)

    def param_roles(self) -> dict[str, Role]:
        # its norms, attention and MLP are entries that answer for their own
        return PerLayerGate.param_roles("per_layer_input") if self.per_layer_input is not None else {}

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """The layer scalar at 1 (``Decoder.init_weights`` calls it; a buffer no Linear holds)."""
        if self.layer_scalar is not None:
            self.layer_scalar.fill_(1.0)

    def finish(self, x: Tensor, per_layer: Optional[Tensor]) -> Tensor:
        """The stream after the sublayers, plus the gated per-layer input ``per_layer`` ``[B, T, p]`` (where the
        model has them), times the layer scalar (where ``layer_scalar``), as Gemma 4's layers end."""
        if self.per_layer_input is not None:
            assert per_layer is not None, "the Decoder hands each layer its input"
            gate = self.per_layer_input
            x = (
                x + gate(x, per_layer)
                if self.layer_stream is None
                else self.layer_stream.add(x, lambda a: gate(a, per_layer))
            )
        return x if self.layer_scalar is None else x * self.layer_scalar.to(x.dtype)

    def through(self, x: Tensor, *args) -> Tensor:
        """The block on the streams ``x``: itself, or inside its layer connection, on the stream that reads
        (``forward``'s other arguments ``args``)."""
        return self(x, *args) if self.layer_stream is None else self.layer_stream(x, lambda a: self(a, *args))

    @staticmethod
    def takes_laurel(cfg: ModelConfig) -> bool:
        """Whether attention reads a normed input that LAuReL can read too (``with_laurel``): no."""
        return False

    @staticmethod
    def unit_weights(cfg: ModelConfig) -> bool:
        """Whether training puts the parts' matrices back on the unit sphere after each step (nGPT's): no."""
        return False

    def with_laurel(self, x: Tensor, normed: Tensor) -> Tensor:
        """The stream ``x`` after attention's add, joined by LAuReL's branch of ``normed`` where there is one."""
        return x if self.laurel is None else self.laurel(x, normed)

    def into_residual(self, y: Tensor) -> Tensor:
        """A sublayer's output as it joins the residual stream: times ``residual_multiplier`` (Granite)."""
        return y if self.residual_multiplier == 1.0 else y * self.residual_multiplier

    def residual_add(self, x: Tensor, y: Tensor, sublayer: int) -> Tensor:
        """``x + into_residual(y)``; with ``residual_rule: depth`` the i-th add of the stack weighs both,
        x·√((i−1)/i) + y/√i, i = 2·layer + 2 + sublayer (attention 0, MLP 1; the embedding is the first
        add, so every layer counts two: transformers' Beam ``depth_scaled_residual_add``)."""
        y = self.into_residual(y)
        if not self.depth_scaled:
            return x + y
        i = 2 * self.layer + 2 + sublayer
        return y * (1.0 / math.sqrt(i)) + x * math.sqrt((i - 1) / i)

    def attend(self, x: Tensor, rotary: Optional[Rotation], mask: Optional[Tensor], cache: Optional[KVCache]) -> Tensor:
        return self.drop(self.attn(x, rotary, mask, cache, self.layer))

    def feed(
        self, x: Tensor, mask: Optional[Tensor], cache: Optional[KVCache], stream: Optional[Tensor] = None
    ) -> Tensor:
        """The MLP of ``x``; a ``stateful`` one (RWKV's channel-mix) is handed the mixer's mask and the cache,
        one that ``reads_stream`` (a MoE beside its MLP) the unnormed ``stream`` ``x`` was normed from."""
        assert self.mlp is not None  # called only where the block holds one
        if self.mlp.reads_stream:
            assert stream is not None, "validate: an MLP reading the stream is in a pre or sandwich block"
            return self.mlp(x, stream)
        return self.mlp(x, mask, cache, self.layer) if self.mlp.stateful else self.mlp(x)

    @staticmethod
    def norm_names(cfg: ModelConfig) -> tuple[str, ...]:
        """The norms this wiring holds, by attribute name."""
        return ("attn_norm", "mlp_norm")

    @classmethod
    def held_norms(cls, cfg: ModelConfig) -> tuple[str, ...]:
        """The norms a block of this wiring builds: ``norm_names``, less the MLP's where the MLP entry is
        not ``present``."""
        names = cls.norm_names(cfg)
        return names if MLPS.get(cfg.mlp.kind).present else tuple(n for n in names if not n.startswith("mlp_"))

    @classmethod
    def norms_per_block(cls, cfg: ModelConfig) -> int:
        """How many norms one block holds (beyond any inside its attention and MLP)."""
        return len(cls.held_norms(cfg))

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """The block's own parameters, beside its attention's and MLP's: its norms, of d_model each."""
        return cls.norms_per_block(cfg) * NORMS.get(cfg.norm.kind).num_params(cfg)

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        checks.positive("model.block.residual_multiplier", cfg.block.residual_multiplier)
        laurel.validate(cfg, cls.takes_laurel(cfg))
        if cfg.block.layer_scalar and cfg.stream.kind != "plain":
            raise ConfigError("model.block.layer_scalar", True, f"false with model.stream.kind={cfg.stream.kind}")
        for name in ("attn_norm", "mlp_norm", "final_norm"):
            if getattr(cfg.block, name) is not True and cfg.block.kind != "pre":
                raise ConfigError(
                    f"model.block.{name}", getattr(cfg.block, name), "true with block kind " + cfg.block.kind
                )
        for name in ("attn_norm_gate", "mlp_norm_gate"):
            rank = getattr(cfg.block, name)
            if rank is not None:
                checks.integer(f"model.block.{name}", rank, 1, "a positive integer, or null")
                if cfg.block.kind != "pre":
                    raise ConfigError(f"model.block.{name}", rank, f"null with block kind {cfg.block.kind} (pre only)")
        if cfg.block.attn_norm_gate is not None and not cfg.block.attn_norm:
            raise ConfigError("model.block.attn_norm_gate", cfg.block.attn_norm_gate, "null without attn_norm")
        if cfg.block.mlp_norm_gate is not None and not cfg.block.mlp_norm:
            raise ConfigError("model.block.mlp_norm_gate", cfg.block.mlp_norm_gate, "null without mlp_norm")
        if cfg.block.residual_rule == "depth" and cfg.stream.kind != "plain":
            raise ConfigError(
                "model.block.residual_rule",
                "depth",
                f"constant with model.stream.kind={cfg.stream.kind} (its connections weigh the streams)",
            )

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        m = cfg.block.residual_multiplier
        text = cfg.block.kind if m == 1.0 else f"{cfg.block.kind} residual×{m:g}"
        text += " depth-scaled adds" if cfg.block.residual_rule == "depth" else ""
        text += " layer scalar" if cfg.block.layer_scalar else ""
        gates = [
            f"{n} gate {r}"
            for n, r in (("attn_norm", cfg.block.attn_norm_gate), ("mlp_norm", cfg.block.mlp_norm_gate))
            if r
        ]
        return text + "".join(f", {g}" for g in gates)

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        return frozenset(
            {"residual_multiplier", "residual_rule", "layer_scalar", "laurel_rank"}
        )  # shared_norm is the parallel block's


BLOCKS: Registry[type[Block]] = Registry("model.block.kind", base=Block)


@BLOCKS.register("pre")
class PreNorm(Block):
    """``x + attn(norm(x))`` then ``x + mlp(norm(x))``, final norm after the last block (GPT-2, LLaMA); with
    ``attn_norm: false`` attention reads x itself, no norm built (ModernBERT's first layer, whose input is
    the normed embeddings); ``mlp_norm: false`` the MLP likewise, ``final_norm: false`` the head (Qwen4-Exp,
    whose streams' reads norm them)."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__(cfg, layer)
        attn, mlp = cfg.block.attn_norm_gate, cfg.block.mlp_norm_gate
        self.attn_norm_gate = NormGate(cfg.d_model, attn) if self.attn_norm is not None and attn is not None else None
        self.mlp_norm_gate = NormGate(cfg.d_model, mlp) if self.mlp_norm is not None and mlp is not None else None

    def param_roles(self) -> dict[str, Role]:
        gates = [n for n in ("attn_norm_gate", "mlp_norm_gate") if getattr(self, n) is not None]
        return super().param_roles() | {k: v for n in gates for k, v in NormGate.param_roles(n).items()}

    def forward(self, x, rotary=None, mask=None, cache=None, joined=None):
        """``joined``: what a shared-block use adds to the layer's input before its norm (``nn/shared.py``),
        not to the residual stream."""
        if self.attn_stream is not None:  # several streams [B, T, n, d]: each connection reads and writes them
            return self._connected(x, rotary, mask, cache)
        entering = x if joined is None else x + joined
        normed = self._attn_input(entering)
        x = self.with_laurel(self.residual_add(x, self.attend(normed, rotary, mask, cache), 0), normed)
        if self.mlp is None:
            return x
        return self.residual_add(x, self.drop(self.feed(self._mlp_input(x), mask, cache, x)), 1)

    def _attn_input(self, x: Tensor) -> Tensor:
        if self.attn_norm is None:
            return x
        y = self.attn_norm(x)
        return y if self.attn_norm_gate is None else self.attn_norm_gate(y)

    def _mlp_input(self, x: Tensor) -> Tensor:
        if self.mlp_norm is None:
            return x
        y = self.mlp_norm(x)
        return y if self.mlp_norm_gate is None else self.mlp_norm_gate(y)

    def _connected(self, h, rotary, mask, cache):
        """The same sublayers, each joined to the residual streams ``h`` by its connection."""
        assert self.attn_stream is not None
        h = self.attn_stream(h, lambda x: self.into_residual(self.attend(self._attn_input(x), rotary, mask, cache)))
        if self.mlp is None:
            return h
        assert self.mlp_stream is not None
        return self.mlp_stream(h, lambda x: self.into_residual(self.drop(self.feed(self._mlp_input(x), mask, cache))))

    @staticmethod
    def norm_names(cfg: ModelConfig) -> tuple[str, ...]:
        return tuple(n for n in ("attn_norm", "mlp_norm") if getattr(cfg.block, n))

    @staticmethod
    def takes_laurel(cfg: ModelConfig) -> bool:
        return bool(cfg.block.attn_norm)

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """Its norms, and each gated norm's gate, 2·d·rank (``attn_norm_gate``, ``mlp_norm_gate``)."""
        held, b = cls.held_norms(cfg), cfg.block
        gates = [(n, r) for n, r in (("attn_norm", b.attn_norm_gate), ("mlp_norm", b.mlp_norm_gate)) if r is not None]
        return super().num_params(cfg, layer) + sum(NormGate.num_params(cfg.d_model, r) for n, r in gates if n in held)

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        return super().reads(cfg) | {"attn_norm", "mlp_norm", "final_norm", "attn_norm_gate", "mlp_norm_gate"}


@BLOCKS.register("post")
class PostNorm(Block):
    """``norm(x + attn(x))`` then ``norm(x + mlp(x))`` (Vaswani et al. 2017); no final norm."""

    final_norm = False

    def forward(self, x, rotary=None, mask=None, cache=None):
        assert self.attn_norm is not None  # built: this wiring's norm_names
        x = self.attn_norm(self.residual_add(x, self.attend(x, rotary, mask, cache), 0))
        if self.mlp is None:
            return x
        assert self.mlp_norm is not None
        return self.mlp_norm(self.residual_add(x, self.drop(self.feed(x, mask, cache)), 1))


@BLOCKS.register("parallel")
class Parallel(Block):
    """``x + attn(n1(x)) + mlp(n2(x))``; with ``shared_norm`` n1 is n2 (GPT-J), else two norms."""

    def forward(self, x, rotary=None, mask=None, cache=None):
        assert self.attn_norm is not None  # built: this wiring's norm_names
        h = self.attn_norm(x)
        attended = self.attend(h, rotary, mask, cache)
        if self.mlp is None:
            return x + self.into_residual(attended)
        h_mlp = h if self.mlp_norm is None else self.mlp_norm(x)
        return x + self.into_residual(attended) + self.into_residual(self.drop(self.feed(h_mlp, mask, cache)))

    @staticmethod
    def norm_names(cfg: ModelConfig) -> tuple[str, ...]:
        return ("attn_norm",) if cfg.block.shared_norm else ("attn_norm", "mlp_norm")

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        super().validate(cfg)
        if cfg.block.residual_rule != "constant":  # one add joins both sublayers: no i per sublayer
            raise ConfigError("model.block.residual_rule", cfg.block.residual_rule, "constant with block kind parallel")

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        return frozenset({"shared_norm", "residual_multiplier", "residual_rule", "layer_scalar", "laurel_rank"})


@BLOCKS.register("post_sublayer")
class PostSublayerNorm(Block):
    """``x + norm(attn(x))`` then ``x + norm(mlp(x))``: each sublayer's output is normed before the
    residual add, and a final norm follows the last block (OLMo 2)."""

    def forward(self, x, rotary=None, mask=None, cache=None):
        assert self.attn_out_norm is not None  # built: this wiring's norm_names
        x = self.residual_add(x, self.drop(self.attn_out_norm(self.attn(x, rotary, mask, cache, self.layer))), 0)
        if self.mlp is None:
            return x
        assert self.mlp_out_norm is not None
        return self.residual_add(x, self.drop(self.mlp_out_norm(self.feed(x, mask, cache))), 1)

    @staticmethod
    def norm_names(cfg: ModelConfig) -> tuple[str, ...]:
        return ("attn_out_norm", "mlp_out_norm")


@BLOCKS.register("sandwich")
class SandwichNorm(Block):
    """``x + norm(attn(norm(x)))`` then ``x + norm(mlp(norm(x)))``: a norm before and after each
    sublayer, and a final norm (Gemma 2)."""

    def forward(self, x, rotary=None, mask=None, cache=None):
        assert self.attn_norm is not None and self.attn_out_norm is not None  # built: this wiring's norm_names
        normed = self.attn_norm(x)
        attended = self.drop(self.attn_out_norm(self.attn(normed, rotary, mask, cache, self.layer)))
        x = self.with_laurel(self.residual_add(x, attended, 0), normed)
        if self.mlp is None:
            return x
        assert self.mlp_norm is not None and self.mlp_out_norm is not None
        return self.residual_add(x, self.drop(self.mlp_out_norm(self.feed(self.mlp_norm(x), mask, cache, x))), 1)

    @staticmethod
    def norm_names(cfg: ModelConfig) -> tuple[str, ...]:
        return ("attn_norm", "mlp_norm", "attn_out_norm", "mlp_out_norm")

    @staticmethod
    def takes_laurel(cfg: ModelConfig) -> bool:
        return True


def build_block(cfg: ModelConfig, layer: int) -> Block:
    return BLOCKS.get(cfg.block.kind)(cfg, layer)

"""The ``normed_skip`` block wiring (MiniMax-01's decoder layer): each sublayer's skip is its input after the
norm, not before it, and both the skip and the sublayer's output are scaled (``model.block.attn_alpha`` ...),
the DeepNorm-style multipliers MiniMax-Text-01 sets."""

from __future__ import annotations

from archlab import checks
from archlab.config import ModelConfig
from archlab.errors import ConfigError
from archlab.nn import laurel
from archlab.nn.block import BLOCKS, Block

FIELDS = ("attn_alpha", "attn_beta", "mlp_alpha", "mlp_beta")


@BLOCKS.register("normed_skip")
class NormedSkip(Block):
    """``h = a_α·n1(x) + a_β·attn(n1(x))`` then ``m_α·n2(h) + m_β·mlp(n2(h))``: the residual stream is carried
    after each norm (transformers' ``MiniMaxDecoderLayer``); a final norm after the last block."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__(cfg, layer)
        b = cfg.block
        self.attn_alpha, self.attn_beta, self.mlp_alpha, self.mlp_beta = (getattr(b, name) for name in FIELDS)

    def forward(self, x, rotary=None, mask=None, cache=None):
        assert self.attn_norm is not None  # built: this wiring's norm_names
        h = self.attn_norm(x)
        h = self.attn_alpha * h + self.attn_beta * self.attend(h, rotary, mask, cache)
        if self.mlp is None:
            return h
        assert self.mlp_norm is not None
        h = self.mlp_norm(h)
        return self.mlp_alpha * h + self.mlp_beta * self.drop(self.feed(h, mask, cache))

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        for name in FIELDS:
            checks.positive(f"model.block.{name}", getattr(cfg.block, name))
        laurel.validate(cfg, takes=False)  # its skips are its own
        if cfg.block.attn_norm is not True:
            raise ConfigError("model.block.attn_norm", cfg.block.attn_norm, "true with block kind normed_skip")
        if cfg.block.residual_rule != "constant":  # its skip is the normed input, scaled by its alphas
            raise ConfigError(
                "model.block.residual_rule", cfg.block.residual_rule, "constant with block kind normed_skip"
            )

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``normed_skip attn <α>·x + <β>·f, mlp <α>·x + <β>·f``."""
        b = cfg.block
        return f"normed_skip attn {b.attn_alpha:g}·x + {b.attn_beta:g}·f, mlp {b.mlp_alpha:g}·x + {b.mlp_beta:g}·f"

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """Its four multipliers (not residual_multiplier: its betas scale the sublayers' outputs)."""
        return frozenset(FIELDS)

"""Emu3's language model (``Emu3ForCausalLM``, ``emu3_text_model``): LLaMA's layers, with each sublayer's
output dropped at ``attention_dropout`` before its residual add. Its vision-language wrapper
(``Emu3ForConditionalGeneration``) is read as this language model (``interop/wrapped.py``)."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import Family, Rule, no_embedding_dropout
from archlab.interop.families.llama import Llama
from archlab.interop.families.values import dropouts

_TOKEN_ID = 0  # Emu3TextConfig's bos and pad ids: ints (None is refused); archlab holds no special tokens


class Emu3Text(Llama):
    """Emu3ForCausalLM (``Emu3TextConfig``): LLaMA's parts and bias flags; ``attention_dropout`` drops the
    attention probabilities and each sublayer's output (archlab's ``model.dropout``), never the embeddings."""

    defers = True  # to LLaMA, which holds its layouts without dropout: the same model

    model_type, title, model_class, config_class = "emu3_text_model", "Emu3", "Emu3ForCausalLM", "Emu3TextConfig"
    parts = "LLaMA's layers, each sublayer's output dropped at the attention's dropout rate"
    features = Llama.features | {"model.dropout", "model.embedding_dropout"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        why = " (Emu3 drops each sublayer's output at attention_dropout, the attention's rate)"
        return [
            *super().rules(cfg),
            ("model.dropout", (cfg.attention.dropout,), why),
            no_embedding_dropout(cfg, self.title),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(super().to_hf(cfg), bos_token_id=_TOKEN_ID, pad_token_id=_TOKEN_ID)

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        for field, value in dropouts(c.attention_dropout, 0.0).items():
            setattr(cfg, field, value)
        return cfg


RECORDS: tuple[Family, ...] = (Emu3Text(),)

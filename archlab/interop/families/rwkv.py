"""RWKV-4 (RwkvForCausalLM): pre-norm LayerNorm blocks of the time-mix (``attention.kind: rwkv4``) and the
channel-mix (``mlp.kind: rwkv_channel_mix``), a LayerNorm on the embeddings (layer 0's ``pre_ln``), no
positions."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archlab.config import POSITION_OPTIONS, BlockConfig, HeadConfig, ModelConfig, NormConfig
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Rule
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.channel_mix import hidden
from archlab.nn.mixers.rwkv4 import RWKV4Config, width

FINAL_EPS = 1e-5  # transformers' ln_out is nn.LayerNorm(hidden_size): its eps is torch's default, whatever the config


class Rwkv(Family):
    """RwkvForCausalLM (RWKV/rwkv-4-*-pile): ``RwkvSelfAttention`` and ``RwkvFeedForward`` as archlab's
    ``rwkv4`` and ``rwkv_channel_mix`` hold them (the token-shift mixes, stored [1, 1, d], held as [d]), every
    norm a LayerNorm with its bias, the head (``head``, not ``lm_head``) untied or tied. ``rescale_every`` is
    transformers' float16 inference trick: in eval it halves the residual stream every that many blocks and
    divides the output weights to match, which in exact arithmetic moves only the LayerNorms' eps (×4 per
    halving); in training it does nothing. archlab computes the training form: HF's eval form where
    ``num_hidden_layers < rescale_every`` (else to that eps), so a config is read whatever it says and
    written with 0, under which HF's eval is archlab's."""

    parts = "pre-norm LayerNorm (and on the embeddings), RWKV-4 time-mix and channel-mix, no positions"

    model_type, title, model_class, config_class = "rwkv", "RWKV", "RwkvForCausalLM", "RwkvConfig"
    prefix = "rwkv."
    attention_kind = "rwkv4"
    position_kind = "none"
    position_why = " (RWKV has no positions: its token shift and recurrence order the tokens)"
    features = frozenset({"model.embedding_norm"})
    keys = {
        "vocab_size": "vocab_size",
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layer",
        "context_length": "context_length",
        "layer_norm_epsilon": "norm.eps",
        "tie_word_embeddings": "head.tied",
    }

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), ""),
            ("model.norm.eps", (FINAL_EPS,), " (transformers' final ln_out is at torch's default, 1e-5)"),
            ("model.block.kind", ("pre",), ""),
            ("model.embedding_norm", (True,), " (layer 0's pre_ln)"),
            ("model.mlp.kind", ("rwkv_channel_mix",), " (RWKV's feed-forward reads the token before)"),
            NO_HEAD_BIAS,
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            self.keys_to_hf(cfg),
            attention_hidden_size=width(cfg),
            intermediate_size=hidden(cfg),
            rescale_every=0,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.layer_norm_epsilon != FINAL_EPS:
            refuse_hf(c, "layer_norm_epsilon", f"{FINAL_EPS} (ln_out, the final norm, is at torch's default)")
        d = c.hidden_size
        cfg = ModelConfig(
            embedding_norm=True,
            norm=NormConfig(kind="layernorm", bias=True),
            block=BlockConfig(kind="pre"),
            position=POSITION_OPTIONS.make(kind="none"),
            attention=RWKV4Config(width=None if c.attention_hidden_size == d else int(c.attention_hidden_size)),
            mlp=mlp_section("rwkv_channel_mix", d_ff=None if c.intermediate_size == 4 * d else c.intermediate_size),
            head=HeadConfig(bias=False),
        )
        return self.keys_from_hf(c, cfg)

    def hf_weights(self, c: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """A tied checkpoint's head as its embedding (save_pretrained writes the embedding alone)."""
        if c.tie_word_embeddings and "head.weight" not in state:
            return {**state, "head.weight": state["rwkv.embeddings.weight"]}
        return state

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, d = Tensors(cfg), cfg.d_model
        t.add("tok_emb", "rwkv.embeddings")
        t.add("embedding_norm", "rwkv.blocks.0.pre_ln", True)
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"rwkv.blocks.{i}"
            t.add(f"{b}.attn_norm", f"{h}.ln1", True)
            t.add(f"{b}.mlp_norm", f"{h}.ln2", True)
            for name in ("time_decay", "time_first"):
                t.maps.append(TensorMap(f"{b}.attn.{name}", (f"{h}.attention.{name}",)))
            for name in ("time_mix_key", "time_mix_value", "time_mix_receptance"):
                t.maps.append(TensorMap(f"{b}.attn.{name}", (f"{h}.attention.{name}",), "flat", (1, 1, d)))
            for name in ("key", "value", "receptance", "output"):
                t.add(f"{b}.attn.{name}", f"{h}.attention.{name}")
            for name in ("time_mix_key", "time_mix_receptance"):
                t.maps.append(TensorMap(f"{b}.mlp.{name}", (f"{h}.feed_forward.{name}",), "flat", (1, 1, d)))
            for name in ("key", "receptance", "value"):
                t.add(f"{b}.mlp.{name}", f"{h}.feed_forward.{name}")
        t.add("final_norm", "rwkv.ln_out", True)
        # transformers' name is head, not lm_head; tied, it is the embedding under both names on either side
        t.maps.append(TensorMap("head.weight", ("head.weight",)))
        return t.maps


RECORDS: tuple[Family, ...] = (Rwkv(),)

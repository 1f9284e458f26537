"""A.X K1 (``axk1``, SK Telecom): DeepSeek-V3's layout with each MoE layer's output normed
(``post_mlp_layernorm``: archlab's ``model.mlp.out_norm``), queries always through ``q_lora_rank``, the dense
layers by ``mlp_layer_types`` and no multi-token prediction modules."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archlab.config import ModelConfig
from archlab.config.layers import layer_configs
from archlab.interop.families.base import Family, Problem, Rule
from archlab.interop.families.deepseek import _DeepSeek
from archlab.interop.families.experts import is_dense, mlp_tensors, pre_norm_tensors
from archlab.interop.families.layered import view
from archlab.interop.families.sigmoid_moe import dense_prefix, mlp_layer_types
from archlab.interop.families.tensors import TensorMap, Tensors

OUT_NORM = "model.mlp.out_norm"
SAVED, MODULE = ".post_mlp_layernorm.", ".mlp.post_mlp_layernorm."  # the checkpoint's name, the module's


class AXK1(_DeepSeek):
    """AXK1ForCausalLM: ``_DeepSeek``'s latent attention (with ``q_lora_rank`` always), sigmoid grouped
    routing, shared experts and dense first layers, each MoE layer's output (routed + shared) through an
    RMSNorm of ``rms_norm_eps`` (``AXK1MoE.post_mlp_layernorm``), the dense layers' output as it is."""

    model_type, title, model_class, config_class = "axk1", "A.X K1", "AXK1ForCausalLM", "AXK1Config"
    features = _DeepSeek.features | {OUT_NORM}
    parts = "DeepSeek-V3's parts (MLA with q_lora_rank, sigmoid MoE, dense first layers) with a norm on each MoE output"

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().family_rules(cfg) + [(OUT_NORM, (True,), " (its MoE layers norm their output)")]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        found = super().part_problems(cfg)
        if cfg.attention.kind == "mla" and cfg.attention.q_lora_rank is None:
            why = " (its queries always pass q_a_proj, q_a_layernorm, q_b_proj)"
            found.append(Problem("model.attention.q_lora_rank", None, "a positive integer", why))
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        for key in ("first_k_dense_replace", "scoring_func", "topk_method", "num_mtp_layers"):
            del kwargs[key]
        return dict(kwargs, mlp_layer_types=mlp_layer_types(cfg))

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(view(c, first_k_dense_replace=dense_prefix(c)))
        cfg.mlp.out_norm = True  # the MoE section: the dense layer kind's MLP is another option, without it
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        def mlp(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
            mlp_tensors(t, lc, archlab, hf)
            if not is_dense(lc):
                t.add(f"{archlab}.out_norm", f"{hf}.post_mlp_layernorm")

        return pre_norm_tensors(cfg, lambda t, lc, archlab, hf: self.attention_tensors(t, archlab, hf), mlp)

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """As saved, the norm sits beside the MoE block (``layers.i.post_mlp_layernorm``, transformers'
        conversion mapping moves it into ``mlp``); the released checkpoints hold one in the dense layers
        too, which their layers never read: left out."""
        dense = {i for i, lc in enumerate(layer_configs(cfg)) if is_dense(lc)}
        moved = {}
        for name, tensor in state.items():
            if SAVED in name and MODULE not in name:
                layer = int(name.split(".layers.")[1].split(".")[0])
                if layer in dense:
                    continue
                name = name.replace(SAVED, MODULE)
            moved[name] = tensor
        return super().from_checkpoint(cfg, moved)


RECORDS: tuple[Family, ...] = (AXK1(),)

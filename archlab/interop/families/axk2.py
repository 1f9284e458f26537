"""A.X K2 (``axk2``, SK Telecom): DeepSeek-V3.2's layout (``dsa``, its indexer rotating halves) whose queries
and elementwise output gate are one projection of [norm(q latent), q latent] (mla's ``q_latent`` both,
``gate_input`` q_latent), its norms before attention, and before each MoE layer's MLP, gated by a low-rank
sigmoid MLP (``model.block.attn_norm_gate``, ``mlp_norm_gate``), its router ungrouped (A.X K2-Light's)."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.interop.families.base import Family, Problem, Rule, bare, first_per_field
from archlab.interop.families.deepseek_v32 import _SparseAttention
from archlab.interop.families.experts import is_dense, mlp_tensors
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import differences, kind_field, refuse_hf

GATES = ("model.block.attn_norm_gate", "model.block.mlp_norm_gate")


def gated_norm_tensors(t: Tensors, archlab: str, hf: str, gated: bool) -> None:
    """A block norm: RMSNorm's scale, and where gated its gate's two matrices (``AXK2GatedRMSNorm``: ``norm``
    and ``mlp.fc1``, ``mlp.fc2``)."""
    if not gated:
        t.add(archlab, hf)
        return
    t.add(archlab, f"{hf}.norm")
    t.add(f"{archlab}_gate.down", f"{hf}.mlp.fc1")
    t.add(f"{archlab}_gate.up", f"{hf}.mlp.fc2")


def attention_tensors(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
    """DeepSeek-V3.2's attention tensors but q_b_proj: ``q_gate_proj`` holds per head its query rows, then
    its output gate's (archlab's ``q_up`` and ``gate``)."""
    a = lc.attention
    sizes = (a.n_head, a.qk_nope_head_dim + a.qk_rope_head_dim, a.v_head_dim)
    fused = (f"{hf}.q_gate_proj.weight",)
    t.maps.append(TensorMap(f"{archlab}.q_up.weight", fused, "heads_paired", sizes, others=(f"{archlab}.gate.weight",)))
    t.maps.append(TensorMap(f"{archlab}.gate.weight", fused, "heads_paired_second", sizes))
    t.add(f"{archlab}.q_down", f"{hf}.q_a_proj")
    t.add(f"{archlab}.q_norm", f"{hf}.q_a_layernorm")
    for ours, theirs in (("kv_down", "kv_a_proj_with_mqa"), ("kv_norm", "kv_a_layernorm"), ("kv_up", "kv_b_proj")):
        t.add(f"{archlab}.{ours}", f"{hf}.{theirs}")
    t.add(f"{archlab}.proj", f"{hf}.o_proj")
    t.add(f"{archlab}.indexer.q_up", f"{hf}.indexer.wq_b")
    t.add(f"{archlab}.indexer.k_proj", f"{hf}.indexer.wk")
    t.add(f"{archlab}.indexer.k_norm", f"{hf}.indexer.k_norm", bias=True)
    t.add(f"{archlab}.indexer.head_weights", f"{hf}.indexer.weights_proj")


class AXK2(_SparseAttention):
    """AXK2ForCausalLM: ``_SparseAttention``'s layout (dsa in every layer, V3.2's indexer, V3's sigmoid routing
    with shared experts, dense first layers by ``mlp_layer_types``) but: ``q_gate_proj`` of [q_a_layernorm(q),
    q] gives the queries and a sigmoid gate per value dim; ``input_layernorm`` of every layer and
    ``post_attention_layernorm`` of its MoE layers are RMSNorms times sigmoid(fc2(silu(fc1(y)))) of rank
    ``gated_norm_rank``; the router ranks every expert at once (``n_group`` null; grouped, it fills the
    groups it drops with 0, where archlab's excludes them)."""

    model_type, title, model_class, config_class = "axk2", "A.X K2", "AXK2ForCausalLM", "AXK2Config"
    features = _SparseAttention.features | {"model.attention.gate", "model.attention.q_latent", *GATES}
    features |= {"model.attention.gate_input"}
    block_kinds = True  # its dense layers' MLP norm is ungated: a block field of their kind
    parts = "DeepSeek-V3.2's parts, queries and gate from [normed, raw] q latent, low-rank gated block norms"
    index_pairing = "half"

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().family_rules(cfg) + [
            ("model.attention.q_latent", ("both",), " (q_gate_proj reads [q_a_layernorm(q), q])"),
            ("model.attention.gate", ("elementwise",), " (each value dim times its sigmoid gate)"),
            ("model.attention.gate_input", ("q_latent",), " (its gate is q_gate_proj's, of the q latents)"),
            ("model.mlp.routing.n_groups", (1,), " (its grouped router fills dropped groups with 0)"),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """The layout's, then the gated norms': one rank, on every layer's attention norm and on the MoE
        layers' MLP norm alone; no other block field set by a layer kind."""
        found = super().part_problems(cfg)
        b, why = cfg.block, " (one gated_norm_rank gates its norms)"
        if b.attn_norm_gate is None:
            found.append(Problem(GATES[0], None, "a positive integer", " (its input_layernorm is gated)"))
        if b.mlp_norm_gate != b.attn_norm_gate:
            found.append(Problem(GATES[1], b.mlp_norm_gate, bare(b.attn_norm_gate), why))
        for i, lc in enumerate(layer_configs(cfg)):
            kind = layer_kind(cfg, i)
            want = dict(b.__dict__, mlp_norm_gate=None if is_dense(lc) else b.attn_norm_gate)
            for name, value, wanted in differences(lc.block, type(b)(**want)):
                where = (
                    "its dense layers' post_attention_layernorm is ungated" if name == "mlp_norm_gate" else why[2:-1]
                )
                found.append(Problem(kind_field(cfg, kind, f"model.block.{name}"), value, bare(wanted), f" ({where})"))
        return first_per_field(found)

    # its checkpoints' names (the gates' W_down, W_up; the fused q_b_proj) as its modules name them
    checkpoint_renames = {".W_down.": ".mlp.fc1.", ".W_up.": ".mlp.fc2.", ".q_b_proj.": ".q_gate_proj."}

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        for key in ("first_k_dense_replace", "scoring_func", "topk_method"):  # the config has none of these
            del kwargs[key]
        return dict(kwargs, n_group=None, topk_group=None, gated_norm_rank=cfg.block.attn_norm_gate)

    def from_hf(self, c: Any) -> ModelConfig:
        if c.n_group not in (None, 1):
            refuse_hf(
                c, "n_group", "null (its grouped router fills the groups it drops with 0; archlab's excludes them)"
            )
        cfg = super().from_hf(c)
        a, rank = cfg.attention, c.gated_norm_rank
        a.q_latent, a.gate, a.gate_input = "both", "elementwise", "q_latent"
        cfg.block.attn_norm_gate = cfg.block.mlp_norm_gate = rank
        if cfg.layers.kinds:  # the dense first layers: their MLP norm ungated
            cfg.layers.kinds["dense"]["block"] = {"mlp_norm_gate": None}
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for i, lc in enumerate(layer_configs(cfg)):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            gated_norm_tensors(t, f"{b}.attn_norm", f"{h}.input_layernorm", lc.block.attn_norm_gate is not None)
            attention_tensors(t, lc, f"{b}.attn", f"{h}.self_attn")
            gated_norm_tensors(t, f"{b}.mlp_norm", f"{h}.post_attention_layernorm", lc.block.mlp_norm_gate is not None)
            mlp_tensors(t, lc, f"{b}.mlp", f"{h}.mlp")
        t.add("final_norm", "model.norm")
        return t.head()


RECORDS: tuple[Family, ...] = (AXK2(),)

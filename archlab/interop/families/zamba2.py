"""Zamba2 (``Zamba2ForCausalLM``, Zyphra's): pre-norm Mamba-2 layers (archlab's ``mamba2``, no MLP) and, before
the layers at ``hybrid_layer_ids``, a use of one of ``num_mem_blocks`` weight-shared transformer blocks,
round-robin: archlab's ``model.layers.shared`` (``nn/shared.py``), which reads [hidden, embeddings], attends
with heads of 2·hidden_size/num_attention_heads (optionally rotated: ``use_mem_rope``), runs a gated MLP with
each use's low-rank adapters (gate/up's always, q/k/v's with ``use_shared_attention_adapter``), and adds its
use's ``linear`` to the Mamba-2 layer's input before its norm.

transformers ties each block's tensors across its uses (``layers.<i>.shared_transformer`` of a later use is the
first use's) only where it ties the embeddings (``tie_word_embeddings``; untied, every use has weights of its
own, which archlab refuses): the maps name every copy, and a checkpoint ``save_pretrained`` wrote without the copies gets them
back from the first use's on loading. Its Mamba-2 mixer always has a convolution bias (``use_conv_bias`` is not
read), one ``add_bias_linear`` sets the mixer's projection biases and the shared MLP's, its gated norm's eps is
1e-5 whatever ``rms_norm_eps`` says (archlab's is the model's: both 1e-5), and it clamps dt below at
``time_step_min``. ``use_long_context`` only raises ``max_position_embeddings`` (read as it is);
``num_logits_to_keep``, ``use_mamba_kernels`` and ``use_mem_eff_path`` change no logits."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archlab.config import POSITION_OPTIONS, BlockConfig, HeadConfig, ModelConfig, NormConfig
from archlab.config.model import LayersConfig, SharedConfig
from archlab.config.shared import shared_kv_head
from archlab.interop.families.bamba import mamba_tensors
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Problem, Rule, out_bias
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.mamba2 import Mamba2Config, inner

MAMBA_T, HYBRID_T = "linear_attention", "hybrid"
ACTIVATION_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "silu": "silu", "relu": "relu"}
ACTIVATION_FROM_HF = {
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
}
GATED_NORM_EPS = 1e-5  # Zamba2RMSNormGated's, hard-coded
UNTIED_WHY = " (transformers ties a shared block's copies only where it ties the embeddings)"


def first_uses(cfg: ModelConfig) -> list[int]:
    """The layer of each shared block's first use, whose ``shared_transformer`` holds the block's tensors."""
    s = cfg.layers.shared
    return list(s.layers[: s.blocks])


class Zamba2(Family):
    """Zamba2ForCausalLM: see the module docstring."""

    model_type, title, model_class, config_class = "zamba2", "Zamba2", "Zamba2ForCausalLM", "Zamba2Config"
    prefix = "model."
    attention_kind = "mamba2"
    position_kind = "none"
    position_why = " (its Mamba-2 layers have no positions; RoPE is the shared blocks' own: model.layers.shared.rope)"
    parts = "Mamba-2 layers, weight-shared attention+MLP blocks on [hidden, embeddings] with LoRA per use"
    features = frozenset({"model.layers.shared.layers"})
    keys = {
        "vocab_size": "vocab_size",
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layer",
        "max_position_embeddings": "context_length",
        "initializer_range": "init_std",
        "rms_norm_eps": "norm.eps",
        "tie_word_embeddings": "head.tied",
        "n_mamba_heads": "attention.n_head",
        "mamba_d_state": "attention.state_size",
        "mamba_d_conv": "attention.conv_kernel",
        "mamba_ngroups": "attention.groups",
        "chunk_size": "attention.scan_chunk",
        "time_step_min": "attention.dt_min",
        "time_step_max": "attention.dt_max",
        "time_step_floor": "attention.dt_init_floor",
        "add_bias_linear": "attention.qkv_bias",
    }

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        a, d = cfg.attention, cfg.d_model
        whole = [d * k // a.n_head for k in range(1, 5) if d * k % a.n_head == 0]
        one_flag = " (one add_bias_linear sets the Mamba-2 projections' biases and the shared MLP's)"
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.norm.eps", (GATED_NORM_EPS,), " (its Mamba-2 gated norm's eps is 1e-5, archlab's the model's)"),
            ("model.block.kind", ("pre",), ""),
            ("model.mlp.kind", ("none",), " (its Mamba-2 layers have no MLP: the shared blocks hold one)"),
            NO_HEAD_BIAS,
            ("model.head.tied", (True,), UNTIED_WHY),
            out_bias(a.qkv_bias, one_flag),
            ("model.layers.shared.mlp_bias", (a.qkv_bias,), one_flag),
            ("model.attention.conv_bias", (True,), " (its Mamba-2 convolution always has a bias)"),
            ("model.attention.dt_limit_min", (a.dt_min,), " (it clamps dt below at time_step_min, dt_min)"),
            ("model.attention.dt_limit_max", (None,), " (no upper clamp on dt)"),
            (
                "model.attention.head_dim",
                (a.head_dim,) if inner(cfg) % d == 0 else tuple(whole),
                f" (n_head·head_dim is mamba_expand·hidden_size: a multiple of d_model={d})",
            ),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.problems``, then a model without shared blocks (Mamba-2's), without adapters, or with attention
        adapters beside grouped key/value heads (transformers' k/v adapters are 2·hidden_size wide)."""
        found = super().part_problems(cfg)
        s = cfg.layers.shared
        if not s.layers:
            why = " (a Zamba2 without shared blocks is a Mamba-2 model)"
            found.append(Problem("model.layers.shared.layers", [], "at least one layer", why))
        elif s.adapter_rank == 0:
            found.append(Problem("model.layers.shared.adapter_rank", 0, "a positive rank", " (its MLP has adapters)"))
        elif s.attention_adapters and shared_kv_head(cfg) != s.n_head:
            why = " (its k/v adapters are as wide as the queries)"
            found.append(Problem("model.layers.shared.n_kv_head", s.n_kv_head, f"null or {s.n_head}", why))
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        s = cfg.layers.shared
        return dict(
            self.keys_to_hf(cfg),
            layers_block_type=[HYBRID_T if i in s.layers else MAMBA_T for i in range(cfg.n_layer)],
            mamba_expand=inner(cfg) // cfg.d_model,
            use_conv_bias=True,
            num_attention_heads=s.n_head,
            num_key_value_heads=shared_kv_head(cfg),
            intermediate_size=4 * cfg.d_model if s.d_ff is None else s.d_ff,
            hidden_act=ACTIVATION_TO_HF[s.activation],
            attention_dropout=0.0,
            num_mem_blocks=s.blocks,
            adapter_rank=s.adapter_rank,
            use_shared_attention_adapter=s.attention_adapters,
            use_mem_rope=s.rope,
            rope_parameters={"rope_type": "default", "rope_theta": s.rope_theta},
            use_long_context=False,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.hidden_act not in ACTIVATION_FROM_HF:
            refuse_hf(c, "hidden_act", f"one of {sorted(ACTIVATION_FROM_HF)}")
        if c.rms_norm_eps != GATED_NORM_EPS:
            refuse_hf(c, "rms_norm_eps", "1e-05 (its Mamba-2 gated norm's, hard-coded; archlab's is the model's)")
        if c.attention_dropout:
            refuse_hf(c, "attention_dropout", "0.0 (archlab's shared attention has no dropout)")
        if not c.adapter_rank:
            refuse_hf(c, "adapter_rank", "a positive rank")
        if not c.tie_word_embeddings:
            refuse_hf(c, "tie_word_embeddings", "true" + UNTIED_WHY)
        rope = dict(c.rope_parameters or {})
        if c.use_mem_rope and rope.get("rope_type", "default") != "default":
            refuse_hf(c, "rope_parameters", "rope_type 'default' (archlab's shared blocks rotate unscaled)", rope)
        types = list(c.layers_block_type)
        if any(t not in (MAMBA_T, HYBRID_T) for t in types):
            refuse_hf(c, "layers_block_type", f"'{MAMBA_T}' and '{HYBRID_T}' layers", types)
        hybrid = [i for i, t in enumerate(types) if t == HYBRID_T]
        bias = bool(c.add_bias_linear)
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="pre"),
            position=POSITION_OPTIONS.make(kind="none"),
            attention=Mamba2Config(head_dim=c.mamba_headdim, out_bias=bias, conv_bias=True),
            mlp=mlp_section("none"),
            head=HeadConfig(bias=False),
        )
        cfg = self.keys_from_hf(c, cfg)
        cfg.attention.qkv_bias = bias
        cfg.attention.dt_min, cfg.attention.dt_max = float(cfg.attention.dt_min), float(cfg.attention.dt_max)
        cfg.attention.dt_init_floor = float(cfg.attention.dt_init_floor)
        cfg.attention.dt_limit_min = cfg.attention.dt_min
        kv = c.num_key_value_heads
        cfg.layers = LayersConfig(
            shared=SharedConfig(
                layers=hybrid,
                blocks=min(c.num_mem_blocks, len(hybrid)) if hybrid else 1,
                n_head=c.num_attention_heads,
                n_kv_head=None if kv in (None, c.num_attention_heads) else kv,
                d_ff=c.intermediate_size,
                activation=ACTIVATION_FROM_HF[c.hidden_act],
                mlp_bias=bias,
                adapter_rank=c.adapter_rank,
                attention_adapters=bool(c.use_shared_attention_adapter),
                rope=bool(c.use_mem_rope),
                rope_theta=float(rope.get("rope_theta", 10000.0)),
            )
        )
        return cfg

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        return with_tied_copies(cfg, state, "shared_transformer")

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        s = cfg.layers.shared
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        use = {layer: u for u, layer in enumerate(s.layers)}
        for i in range(cfg.n_layer):
            h = f"model.layers.{i}" + (".mamba_decoder" if i in use else "")
            t.add(f"blocks.{i}.attn_norm", f"{h}.input_layernorm")
            mamba_tensors(t, cfg, f"blocks.{i}.attn", f"{h}.mamba")
            if i in use:
                t.add(f"shared.uses.{use[i]}.out", f"model.layers.{i}.linear")
        for u, layer in enumerate(s.layers):  # every use's copy of its block, and its adapters in that block
            b = u % s.blocks
            ours, theirs = f"shared.blocks.{b}", f"model.layers.{layer}.shared_transformer"
            shared_attention_tensors(t, ours, theirs)
            t.add(f"{ours}.gate_up", f"{theirs}.feed_forward.gate_up_proj", s.mlp_bias)
            t.add(f"{ours}.down", f"{theirs}.feed_forward.down_proj", s.mlp_bias)
            for v in range(len(s.layers)):  # the adapters of every use of block b, each copy holding them
                if v % s.blocks != b:
                    continue
                adapters = [("gate_up", f"feed_forward.gate_up_proj_adapter_list.{v}")]
                if s.attention_adapters:
                    adapters += [(n, f"self_attn.linear_{n}_adapter_list.{v}") for n in "qkv"]
                for name, where in adapters:
                    t.add(f"shared.uses.{v}.{name}.down", f"{theirs}.{where}.0")
                    t.add(f"shared.uses.{v}.{name}.up", f"{theirs}.{where}.1")
        t.add("final_norm", "model.final_layernorm")
        return t.head()


def with_tied_copies(cfg: ModelConfig, state: dict[str, Tensor], module: str) -> dict[str, Tensor]:
    """A checkpoint's tensors with each later use's tied copy of its block (``model.layers.<i>.<module>``;
    ``save_pretrained`` writes the first use's alone) taken from the first use's, as transformers ties them."""
    s, out = cfg.layers.shared, dict(state)
    firsts = first_uses(cfg)
    for u, layer in enumerate(s.layers):
        source = f"model.layers.{firsts[u % s.blocks]}.{module}."
        target = f"model.layers.{layer}.{module}."
        if source != target:
            for k, v in state.items():
                if k.startswith(source):
                    out.setdefault(target + k.removeprefix(source), v)
    return out


def shared_attention_tensors(t: Tensors, ours: str, theirs: str) -> None:
    """A shared block's norms and attention (Zamba's and Zamba2's): input_layernorm over [hidden, embeddings],
    q/k/v/o_proj, pre_ff_layernorm."""
    t.add(f"{ours}.attn_norm", f"{theirs}.input_layernorm")
    for name in "qkv":
        t.add(f"{ours}.{name}", f"{theirs}.self_attn.{name}_proj")
    t.add(f"{ours}.proj", f"{theirs}.self_attn.o_proj")
    t.add(f"{ours}.mlp_norm", f"{theirs}.pre_ff_layernorm")


RECORDS: tuple[Family, ...] = (Zamba2(),)

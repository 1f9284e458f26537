"""Hugging Face transformers <-> archlab: configs and weights of GPT-2, GPT-J and LLaMA, both ways.

The family follows from the archlab layout: pre-norm + learned positions is ``GPT2LMHeadModel``,
parallel block + RoPE is ``GPTJForCausalLM``, pre-norm + RoPE is ``LlamaForCausalLM``. Anything a
family cannot hold exactly is refused with a ConfigError naming the field. ``transformers`` is an
optional extra (``pip install -e ".[hf]"``), imported only inside these functions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from archlab.build import build_model
from archlab.config import (
    AttentionConfig,
    BlockConfig,
    HeadConfig,
    MLPConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
    head_dim,
    n_kv_head,
    to_model_config,
)
from archlab.errors import ConfigError
from archlab.nn.mlp import d_ff
from archlab.nn.model import Decoder
from archlab.nn.positions import rotary_dim
from archlab.nn.validation import validate

# family -> (transformers model class, its config class)
HF_CLASSES = {
    "gpt2": ("GPT2LMHeadModel", "GPT2Config"),
    "gptj": ("GPTJForCausalLM", "GPTJConfig"),
    "llama": ("LlamaForCausalLM", "LlamaConfig"),
}
# Prefix of the base model's tensors, missing from checkpoints saved from the base model alone.
_BASE_PREFIX = {"gpt2": "transformer.", "gptj": "transformer.", "llama": "model."}
# Buffers that older checkpoints carry: causal masks (GPT-2, GPT-J) and rotary frequencies (LLaMA).
_BUFFERS = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")

# Plain MLPs (GPT-2, GPT-J compute act(fc(x))): transformers activation <-> archlab (kind, approximate).
_PLAIN_FROM_HF = {
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "gelu": ("gelu", "none"),
    "relu": ("relu", "none"),
}
_PLAIN_TO_HF = {("gelu", "tanh"): "gelu_new", ("gelu", "none"): "gelu"}
# Gated MLPs (LLaMA computes down(act(gate(x)) * up(x))): hidden_act <-> archlab (kind, approximate).
_GATED_FROM_HF = {
    "silu": ("swiglu", "none"),
    "gelu": ("geglu", "none"),
    "gelu_pytorch_tanh": ("geglu", "tanh"),
    "gelu_new": ("geglu", "tanh"),
}
_GATED_TO_HF = {("swiglu", "none"): "silu", ("geglu", "none"): "gelu", ("geglu", "tanh"): "gelu_pytorch_tanh"}
# Fields none of the families above can hold other than at their defaults.
_PLAIN_RULES = [
    ("model.attention.kind", ("causal",), ""),
    ("model.attention.qk_norm", ("none",), " (no QK-norm)"),
    ("model.attention.scale", (None,), " (scores scaled by 1/sqrt(head_dim))"),
    ("model.attention.softcap", (None,), " (no score soft-capping)"),
    ("model.attention.window", (None,), " (no sliding window)"),
    ("model.head.kind", ("linear",), ""),
    ("model.head.softcap", (None,), " (no logit soft-capping)"),
    ("model.scale_embedding", (False,), " (unscaled embeddings)"),
    ("model.norm.unit_offset", (False,), ""),
    ("model.position.scaling", ("none",), " (unscaled RoPE)"),
]


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError('Hugging Face interop needs transformers: pip install -e ".[hf]"') from e
    return transformers


def _fmt(value: Any) -> str:
    """A value as it is written in YAML: true, false, null, 'text', 1.0."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    return repr(value)


def _expect(cfg: ModelConfig, family: str, rules: list[tuple[str, tuple, str]]) -> None:
    """Refuse the first field (``model.a.b``) whose value is not one ``family`` can hold."""
    for field, allowed, why in rules:
        value = cfg
        for part in field.split(".")[1:]:
            value = getattr(value, part)
        if value not in allowed:
            options = " or ".join(_fmt(a) for a in allowed)
            raise ConfigError(field, value, f"{options} to convert to Hugging Face {family}{why}")


# ---------------------------------------------------------------- archlab config -> HF config


def hf_family(cfg: Any) -> str:
    """``gpt2``, ``gptj`` or ``llama``: the family whose wiring matches this layout's block and positions."""
    cfg = validate(to_model_config(cfg))
    block, position = cfg.block.kind, cfg.position.kind
    family = {("pre", "learned"): "gpt2", ("parallel", "rope"): "gptj", ("pre", "rope"): "llama"}.get((block, position))
    if family:
        return family
    if block not in ("pre", "parallel"):
        raise ConfigError(
            "model.block.kind", block, "pre (GPT-2, LLaMA) or parallel (GPT-J) to convert to Hugging Face"
        )
    if position not in ("learned", "rope"):
        raise ConfigError(
            "model.position.kind", position, "learned (GPT-2) or rope (GPT-J, LLaMA) to convert to Hugging Face"
        )
    raise ConfigError("model.position.kind", position, "rope with model.block.kind=parallel (GPT-J)")


def _mha_rules(cfg: ModelConfig, family: str) -> list[tuple[str, tuple, str]]:
    H, d = cfg.attention.n_head, cfg.d_model
    return [
        ("model.attention.n_kv_head", (None, H), f" ({family} has one key/value head per query head)"),
        ("model.attention.head_dim", (None, d // H), f" ({family} uses d_model / n_head)"),
    ]


def _gpt_rules() -> list[tuple[str, tuple, str]]:
    """GPT-2 and GPT-J share LayerNorm with a bias and a two-matrix MLP with biases."""
    return [
        ("model.norm.kind", ("layernorm",), ""),
        ("model.norm.bias", (True,), ""),
        ("model.mlp.kind", ("gelu", "relu"), ""),
        ("model.mlp.bias", (True,), ""),
    ]


def _activation(cfg: ModelConfig) -> str:
    return "relu" if cfg.mlp.kind == "relu" else _PLAIN_TO_HF[(cfg.mlp.kind, cfg.mlp.approximate)]


def _gpt_common_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    """Config fields GPT2Config and GPTJConfig share (same names, same meaning)."""
    return dict(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.context_length,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layer,
        n_head=cfg.attention.n_head,
        n_inner=d_ff(cfg),
        activation_function=_activation(cfg),
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.attention.dropout,
        layer_norm_epsilon=cfg.norm.eps,
        initializer_range=cfg.init_std,
        tie_word_embeddings=cfg.head.tied,
    )


def _gpt2_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    family = "GPT-2"
    _expect(
        cfg,
        family,
        _gpt_rules()
        + _mha_rules(cfg, family)
        + [
            ("model.attention.qkv_bias", (True,), " (Conv1D layers always have a bias)"),
            ("model.attention.out_bias", (True,), " (Conv1D layers always have a bias)"),
            ("model.head.bias", (False,), ""),
        ],
    )
    return _gpt_common_kwargs(cfg)


def _gptj_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    family = "GPT-J"
    _expect(
        cfg,
        family,
        _gpt_rules()
        + _mha_rules(cfg, family)
        + [
            ("model.block.shared_norm", (True,), " (one ln_1 feeds attention and MLP)"),
            ("model.position.pairing", ("interleaved",), ""),
            ("model.position.theta", (10000.0,), " (GPT-J's rotary base is fixed)"),
            ("model.attention.qkv_bias", (False,), ""),
            ("model.attention.out_bias", (False,), ""),
            ("model.head.bias", (True,), ""),
        ],
    )
    return dict(_gpt_common_kwargs(cfg), rotary_dim=rotary_dim(cfg))


def _llama_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    family = "LLaMA"
    a = cfg.attention
    _expect(
        cfg,
        family,
        [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.position.pairing", ("half",), ""),
            ("model.mlp.kind", ("swiglu", "geglu"), ""),
            ("model.attention.out_bias", (a.qkv_bias,), " (one attention_bias flag sets q/k/v and output biases)"),
            ("model.head.bias", (False,), ""),
            ("model.dropout", (0.0,), " (LlamaForCausalLM has no embedding or residual dropout)"),
        ],
    )
    if rotary_dim(cfg) != head_dim(cfg):
        raise ConfigError(
            "model.position.rotary_dim",
            rotary_dim(cfg),
            f"head_dim={head_dim(cfg)} (full rotary) to convert to Hugging Face LLaMA",
        )
    return dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=d_ff(cfg),
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=a.n_head,
        num_key_value_heads=n_kv_head(cfg),
        head_dim=head_dim(cfg),
        hidden_act=_GATED_TO_HF[(cfg.mlp.kind, cfg.mlp.approximate)],
        max_position_embeddings=cfg.context_length,
        initializer_range=cfg.init_std,
        rms_norm_eps=cfg.norm.eps,
        tie_word_embeddings=cfg.head.tied,
        rope_theta=cfg.position.theta,
        attention_bias=a.qkv_bias,
        attention_dropout=a.dropout,
        mlp_bias=cfg.mlp.bias,
    )


_TO_HF = {"gpt2": _gpt2_kwargs, "gptj": _gptj_kwargs, "llama": _llama_kwargs}


def config_to_hf(cfg: Any, **hf_kwargs: Any) -> Any:
    """The transformers config of the family that holds ``cfg`` exactly; ``hf_kwargs`` are passed on
    (archlab configs carry no special tokens, so bos/eos/pad ids default to None)."""
    cfg = validate(to_model_config(cfg))
    family = hf_family(cfg)
    _expect(cfg, HF_CLASSES[family][0], _PLAIN_RULES)
    kwargs = {**_TO_HF[family](cfg), "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, **hf_kwargs}
    return getattr(_transformers(), HF_CLASSES[family][1])(**kwargs)


# ---------------------------------------------------------------- HF config -> archlab config


def _hf_refuse(hf_config: Any, name: str, allowed: str) -> None:
    raise ConfigError(f"{type(hf_config).__name__}.{name}", getattr(hf_config, name, None), allowed)


def _plain_mlp(c: Any, width: int | None) -> MLPConfig:
    if c.activation_function not in _PLAIN_FROM_HF:
        _hf_refuse(c, "activation_function", f"one of {sorted(_PLAIN_FROM_HF)}")
    kind, approximate = _PLAIN_FROM_HF[c.activation_function]
    return MLPConfig(kind=kind, d_ff=width or 4 * c.n_embd, bias=True, approximate=approximate)


def _one_dropout(c: Any) -> float:
    if c.embd_pdrop != c.resid_pdrop:
        _hf_refuse(c, "embd_pdrop", f"equal to resid_pdrop={c.resid_pdrop} (archlab has one model.dropout)")
    return c.resid_pdrop


def _gpt2_config(c: Any) -> ModelConfig:
    for name, want in (
        ("add_cross_attention", False),
        ("scale_attn_weights", True),
        ("scale_attn_by_inverse_layer_idx", False),
    ):
        if getattr(c, name, want) != want:
            _hf_refuse(c, name, f"{_fmt(want)} (archlab attention is causal self-attention scaled by 1/sqrt(head_dim))")
    return ModelConfig(
        vocab_size=c.vocab_size,
        context_length=c.n_positions,
        n_layer=c.n_layer,
        d_model=c.n_embd,
        dropout=_one_dropout(c),
        init_std=c.initializer_range,
        norm=NormConfig(kind="layernorm", eps=c.layer_norm_epsilon, bias=True),
        block=BlockConfig(kind="pre"),
        position=PositionConfig(kind="learned"),
        attention=AttentionConfig(n_head=c.n_head, qkv_bias=True, out_bias=True, dropout=c.attn_pdrop),
        mlp=_plain_mlp(c, c.n_inner),
        head=HeadConfig(tied=c.tie_word_embeddings, bias=False),
    )


def _gptj_config(c: Any) -> ModelConfig:
    return ModelConfig(
        vocab_size=c.vocab_size,
        context_length=c.n_positions,
        n_layer=c.n_layer,
        d_model=c.n_embd,
        dropout=_one_dropout(c),
        init_std=c.initializer_range,
        norm=NormConfig(kind="layernorm", eps=c.layer_norm_epsilon, bias=True),
        block=BlockConfig(kind="parallel", shared_norm=True),
        position=PositionConfig(kind="rope", theta=10000.0, rotary_dim=c.rotary_dim, pairing="interleaved"),
        attention=AttentionConfig(n_head=c.n_head, qkv_bias=False, out_bias=False, dropout=c.attn_pdrop),
        mlp=_plain_mlp(c, c.n_inner),
        head=HeadConfig(tied=c.tie_word_embeddings, bias=True),
    )


def _llama_config(c: Any) -> ModelConfig:
    # transformers 5 keeps RoPE settings in rope_parameters; 4.x in rope_theta + rope_scaling.
    rope = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(
            f"{type(c).__name__}.rope_parameters.rope_type", rope_type, "'default' (archlab implements unscaled RoPE)"
        )
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError(
            f"{type(c).__name__}.rope_parameters.partial_rotary_factor",
            rope["partial_rotary_factor"],
            "1.0 (LlamaForCausalLM rotates whole heads)",
        )
    if c.hidden_act not in _GATED_FROM_HF:
        _hf_refuse(c, "hidden_act", f"one of {sorted(_GATED_FROM_HF)}")
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return ModelConfig(
        vocab_size=c.vocab_size,
        context_length=c.max_position_embeddings,
        n_layer=c.num_hidden_layers,
        d_model=c.hidden_size,
        dropout=0.0,
        init_std=c.initializer_range,
        norm=NormConfig(kind="rmsnorm", eps=c.rms_norm_eps, bias=False),
        block=BlockConfig(kind="pre"),
        position=PositionConfig(kind="rope", theta=float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0)))),
        attention=AttentionConfig(
            n_head=c.num_attention_heads,
            n_kv_head=c.num_key_value_heads or c.num_attention_heads,
            head_dim=hd,
            qkv_bias=c.attention_bias,
            out_bias=c.attention_bias,
            dropout=float(c.attention_dropout),
        ),
        mlp=MLPConfig(
            kind=_GATED_FROM_HF[c.hidden_act][0],
            approximate=_GATED_FROM_HF[c.hidden_act][1],
            d_ff=c.intermediate_size,
            bias=getattr(c, "mlp_bias", False),
        ),
        head=HeadConfig(tied=c.tie_word_embeddings, bias=False),
    )


_FROM_HF = {"gpt2": _gpt2_config, "gptj": _gptj_config, "llama": _llama_config}


def config_from_hf(hf_config: Any) -> ModelConfig:
    """The archlab config of a transformers GPT2Config, GPTJConfig or LlamaConfig (validated)."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in _FROM_HF:
        raise ConfigError("model_type", model_type, f"one of {sorted(_FROM_HF)} (GPT-2, GPT-J, LLaMA)")
    return validate(_FROM_HF[model_type](hf_config))


# ---------------------------------------------------------------- weights


class _Pair(NamedTuple):
    """One archlab tensor and the HF tensor(s) it holds."""

    archlab: str
    hf: tuple[str, ...]
    transpose: bool = False  # GPT-2's Conv1D stores weights as (in, out)
    split: tuple[int, ...] = ()  # archlab's fused qkv / gate_up = these HF tensors stacked along dim 0


def _pairs(family: str, cfg: ModelConfig) -> list[_Pair]:
    """Every tensor of the archlab model with its HF name(s), for this family and config."""
    pairs: list[_Pair] = []
    a = cfg.attention
    qkv_sizes = tuple(n * head_dim(cfg) for n in (a.n_head, n_kv_head(cfg), n_kv_head(cfg)))

    def add(archlab: str, hf: str, bias: bool, transpose: bool = False) -> None:
        pairs.append(_Pair(f"{archlab}.weight", (f"{hf}.weight",), transpose))
        if bias:
            pairs.append(_Pair(f"{archlab}.bias", (f"{hf}.bias",)))

    def add_qkv(archlab: str, hf: str, bias: bool) -> None:  # separate q/k/v projections
        names = [f"{hf}.{x}_proj" for x in "qkv"]
        pairs.append(_Pair(f"{archlab}.weight", tuple(f"{n}.weight" for n in names), split=qkv_sizes))
        if bias:
            pairs.append(_Pair(f"{archlab}.bias", tuple(f"{n}.bias" for n in names), split=qkv_sizes))

    def add_gate_up(archlab: str, hf: str, bias: bool) -> None:  # archlab's [gate | up] = gate_proj, up_proj
        names, sizes = (f"{hf}.gate_proj", f"{hf}.up_proj"), (d_ff(cfg), d_ff(cfg))
        pairs.append(_Pair(f"{archlab}.weight", tuple(f"{n}.weight" for n in names), split=sizes))
        if bias:
            pairs.append(_Pair(f"{archlab}.bias", tuple(f"{n}.bias" for n in names), split=sizes))

    if family == "gpt2":
        pairs += [
            _Pair("tok_emb.weight", ("transformer.wte.weight",)),
            _Pair("position.table.weight", ("transformer.wpe.weight",)),
        ]
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"transformer.h.{i}"
            add(f"{b}.attn_norm", f"{h}.ln_1", True)
            add(f"{b}.attn.qkv", f"{h}.attn.c_attn", True, transpose=True)  # [Q | K | V] in both
            add(f"{b}.attn.proj", f"{h}.attn.c_proj", True, transpose=True)
            add(f"{b}.mlp_norm", f"{h}.ln_2", True)
            add(f"{b}.mlp.fc", f"{h}.mlp.c_fc", True, transpose=True)
            add(f"{b}.mlp.proj", f"{h}.mlp.c_proj", True, transpose=True)
        add("final_norm", "transformer.ln_f", True)
    elif family == "gptj":
        pairs.append(_Pair("tok_emb.weight", ("transformer.wte.weight",)))
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"transformer.h.{i}"
            add(f"{b}.attn_norm", f"{h}.ln_1", True)
            add_qkv(f"{b}.attn.qkv", f"{h}.attn", False)
            add(f"{b}.attn.proj", f"{h}.attn.out_proj", False)
            add(f"{b}.mlp.fc", f"{h}.mlp.fc_in", True)
            add(f"{b}.mlp.proj", f"{h}.mlp.fc_out", True)
        add("final_norm", "transformer.ln_f", True)
    else:
        pairs.append(_Pair("tok_emb.weight", ("model.embed_tokens.weight",)))
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            add(f"{b}.attn_norm", f"{h}.input_layernorm", False)
            add_qkv(f"{b}.attn.qkv", f"{h}.self_attn", a.qkv_bias)
            add(f"{b}.attn.proj", f"{h}.self_attn.o_proj", a.out_bias)
            add(f"{b}.mlp_norm", f"{h}.post_attention_layernorm", False)
            add_gate_up(f"{b}.mlp.gate_up", f"{h}.mlp", cfg.mlp.bias)
            add(f"{b}.mlp.down", f"{h}.mlp.down_proj", cfg.mlp.bias)
        add("final_norm", "model.norm", False)
    if not cfg.head.tied:
        pairs.append(_Pair("head.weight", ("lm_head.weight",)))
    if cfg.head.bias:
        pairs.append(_Pair("head.bias", ("lm_head.bias",)))
    return pairs


def hf_state_to_archlab(cfg: Any, hf_state: dict[str, Tensor], copy: bool = True) -> dict[str, Tensor]:
    """archlab's state dict from a transformers state dict of the family that holds ``cfg``.
    Raises naming every HF tensor that is missing or left unconverted (mask buffers excepted)."""
    cfg = validate(to_model_config(cfg))
    pairs = _pairs(hf_family(cfg), cfg)
    needed = {name for p in pairs for name in p.hf}
    ignored = {"lm_head.weight"} if cfg.head.tied else set()  # the tied head is the embedding
    missing = sorted(needed - hf_state.keys())
    extra = sorted(k for k in hf_state.keys() - needed - ignored if not k.endswith(_BUFFERS))
    if missing or extra:
        raise ValueError(f"Hugging Face weights do not fit the config: missing {missing[:8]}, unexpected {extra[:8]}")
    out = {}
    for p in pairs:
        parts = [hf_state[name] for name in p.hf]
        if p.split:
            out[p.archlab] = torch.cat(parts)
        elif p.transpose:
            out[p.archlab] = parts[0].t().contiguous()
        else:
            out[p.archlab] = parts[0].detach().clone() if copy else parts[0]
    if cfg.head.tied:
        out["head.weight"] = out["tok_emb.weight"]
    return out


def archlab_state_to_hf(cfg: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The transformers state dict (family picked from ``cfg``) of an archlab state dict; fused
    qkv and gate_up tensors are split into separate copies, GPT-2 Conv1D weights transposed."""
    cfg = validate(to_model_config(cfg))
    out = {}
    for p in _pairs(hf_family(cfg), cfg):
        t = state[p.archlab]
        if p.split:
            out.update((name, part.clone()) for name, part in zip(p.hf, t.split(p.split)))
        else:
            out[p.hf[0]] = t.t().contiguous() if p.transpose else t
    return out


def _decoder(cfg: ModelConfig, state: dict[str, Tensor]) -> Decoder:
    """An archlab Decoder holding ``state``'s tensors (built on meta, so nothing is initialised twice)."""
    model = build_model(cfg, device="meta")
    model.load_state_dict(state, strict=True, assign=True)
    if cfg.head.tied:  # assign replaced both parameters: make the head the embedding again
        model.head.tie(model.tok_emb)
    return model


def from_hf(hf_model: Any) -> Decoder:
    """An archlab Decoder with a copy of the weights of a ``GPT2LMHeadModel``, ``GPTJForCausalLM`` or
    ``LlamaForCausalLM``, in the same dtype, device and train/eval mode."""
    cfg = config_from_hf(hf_model.config)
    expected = HF_CLASSES[hf_family(cfg)][0]
    if type(hf_model).__name__ != expected:
        raise TypeError(
            f"from_hf takes a {expected} for a {hf_model.config.model_type} config, got {type(hf_model).__name__}"
        )
    model = _decoder(cfg, hf_state_to_archlab(cfg, hf_model.state_dict(), copy=True))
    return model.train(hf_model.training)


def to_hf(model: Decoder, **hf_kwargs: Any) -> Any:
    """The transformers model (GPT-2, GPT-J or LLaMA, from the layout) with a copy of ``model``'s
    weights, in the same dtype, device and train/eval mode; ``hf_kwargs`` go to its config."""
    cfg = model.cfg
    family = hf_family(cfg)
    p = model.tok_emb.weight
    hf_model = getattr(_transformers(), HF_CLASSES[family][0])(config_to_hf(cfg, **hf_kwargs))
    hf_model = hf_model.to(device=p.device, dtype=p.dtype)
    result = hf_model.load_state_dict(archlab_state_to_hf(cfg, model.state_dict()), strict=False)
    allowed_missing = {"lm_head.weight"} if cfg.head.tied else set()
    if set(result.missing_keys) - allowed_missing or result.unexpected_keys:
        raise RuntimeError(f"conversion to {type(hf_model).__name__} left {result}")
    return hf_model.train(model.training)


# ---------------------------------------------------------------- files


def _read_safetensors_dir(path: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    if not (path / files[0]).exists():
        raise FileNotFoundError(
            f"{path}: no model.safetensors or model.safetensors.index.json (only safetensors checkpoints are read)"
        )
    state: dict[str, Tensor] = {}
    for name in files:
        state.update(load_file(str(path / name)))
    return state


def load_hf_dir(path: str | os.PathLike, dtype: torch.dtype | None = None) -> Decoder:
    """An archlab Decoder from a local Hugging Face checkpoint directory (``save_pretrained`` output:
    config.json + safetensors), in the stored dtype unless ``dtype`` is given."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path}: no config.json; expected a Hugging Face save_pretrained directory")
    cfg = config_from_hf(_transformers().AutoConfig.from_pretrained(str(path), local_files_only=True))
    state = _read_safetensors_dir(path)
    prefix = _BASE_PREFIX[hf_family(cfg)]
    if not any(k.startswith(prefix) for k in state):  # saved from the base model: names lack its prefix
        state = {k if k.startswith("lm_head.") else prefix + k: v for k, v in state.items()}
    state = hf_state_to_archlab(cfg, state, copy=False)
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
        if cfg.head.tied:
            state["head.weight"] = state["tok_emb.weight"]
    return _decoder(cfg, state)


def save_hf_dir(model: Decoder, path: str | os.PathLike, **hf_kwargs: Any) -> Path:
    """Write ``model`` as a Hugging Face checkpoint directory (config.json + model.safetensors)."""
    to_hf(model, **hf_kwargs).save_pretrained(str(path))
    return Path(path)

"""Checkpoints and exports written by earlier versions stay usable: a recorded model config lacking the
fields added since, or with swiglu's ignored ``approximate: tanh``, reads as the model it described."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.accounting import kv_cache_bytes
from archlab.config import model_config_dict, recorded_model_config, to_model_config
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import SharedConfig
from archlab.nn.validation import ignored, validate
from archlab.training.checkpoints import check_checkpoint
from archlab.weights import CONFIG_KEY, load_weights


def old_record(cfg) -> dict:
    """``cfg`` as an earlier archlab recorded it: no kind for attention and head, none of the newer
    fields, RoPE's fields beside the learned table's, and the tanh a GPT-2-based preset left on swiglu."""
    d = model_config_dict(cfg)
    for family, fields in {
        "attention": ("kind", "qk_norm", "scale", "softcap", "window"),
        "head": ("kind", "softcap"),
        "norm": ("unit_offset",),
    }.items():
        for name in fields:
            del d[family][name]
    # one flat position section of every scheme's fields, before RoPE's scalings
    d["position"] |= {"theta": 10000.0, "rotary_dim": None, "rotary_fraction": None, "pairing": "half"}
    del d["scale_embedding"]
    d["mlp"]["approximate"] = "tanh"
    return d


def test_an_old_checkpoint_continues_under_the_same_command(tmp_path):
    cfg = compose_model(["model=nano", "model/mlp=swiglu", "model.n_layer=1"])  # the option now resets tanh
    path = tmp_path / "old.ckpt"
    torch.save({"hyper_parameters": {"model": old_record(cfg)}, "global_step": 7}, path)
    assert check_checkpoint(path, model_config_dict(cfg)) == 7


def test_a_flat_rope_section_reads_as_rope_with_its_scaling_sub_config():
    """A position section recorded when every scheme's fields sat side by side (``scaling: llama3`` and its
    fields beside ALiBi's), on the model and on a layer kind, reads as today's RoPE config with its scaling
    under ``scaling``, the fields it never read dropped: the same model, counted alike."""
    cfg = compose_model(["model=llama3.1-8b", "model.n_layer=2"])
    flat = {"kind": "rope", "theta": 500000.0, "rotary_dim": None, "rotary_fraction": None, "pairing": "half",
            "scaling": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_context": 8192, "beta_fast": 32.0, "alibi_scale": 1.0, "alibi_rounding": "none"}  # fmt: skip
    d = model_config_dict(cfg) | {"position": flat}
    d["layers"] = {
        "kinds": {"short": {"position": {"scaling": "linear", "factor": 2.0}}},
        "pattern": ["short", "short"],
    }
    read = recorded_model_config(d)
    assert read.position == cfg.position
    assert read.layers.kinds == {"short": {"position": {"scaling": {"kind": "linear", "factor": 2.0}}}}
    short = layer_configs(read)[0].position
    assert (short.theta, short.scaling.kind, short.scaling.factor) == (500000.0, "linear", 2.0)
    assert count_params(read) == count_params(cfg)


def test_an_old_export_loads_as_the_same_model(tmp_path):
    cfg = compose_model(["model=nano", "model/mlp=swiglu", "model.n_layer=1"])
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    path = tmp_path / "old.safetensors"
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "head.weight"}  # tied
    save_file(state, str(path), metadata={CONFIG_KEY: json.dumps(old_record(cfg))})
    loaded = load_weights(path).eval()
    idx = torch.randint(0, cfg.vocab_size, (1, 9))
    with torch.no_grad():
        assert torch.equal(loaded(idx), model(idx))


# ---- global_every and dense_layers: earlier versions' two per-layer fields, read as layer kinds ----

V, D, H, KV, HD, F = 32, 16, 4, 2, 4, 24  # vocabulary, width, heads, key/value heads, head size, d_ff


def hand_record(n_layer: int, attention: dict, mlp: dict, layers: dict | None = None) -> dict:
    """A model config as an earlier version wrote it (its fields only, the rest left to the defaults): RMSNorm,
    RoPE, no attention or MLP biases, a tied head."""
    record = {
        "vocab_size": V,
        "context_length": 16,
        "n_layer": n_layer,
        "d_model": D,
        "norm": {"kind": "rmsnorm"},
        "position": {"kind": "rope"},
        "attention": {"n_head": H, "n_kv_head": KV, "head_dim": HD, "qkv_bias": False, "out_bias": False, **attention},
        "mlp": {"bias": False, "d_ff": F, **mlp},
        "head": {"tied": True, "bias": False},
    }
    return record | ({"layers": layers} if layers else {})


def hand_params(n_layer: int, mlp_params: list[int]) -> int:
    """Embedding, then per layer q/k/v/o and two RMSNorm scales, the MLPs given, the final norm."""
    attention = D * H * HD + 2 * D * KV * HD + H * HD * D
    return V * D + n_layer * (attention + 2 * D) + sum(mlp_params) + D


def windows(cfg) -> list:
    return [lc.attention.window for lc in layer_configs(cfg)]


def test_global_every_reads_as_every_nth_layer_global():
    """Gemma 2's window 3 + global_every 2 over 5 layers: layers 1 and 3 global, as the preset now writes
    it (a local and a global kind in turn); the count (SwiGLU MLPs of d_ff) and the KV cache's values
    (local layers keep at most the window) as computed by hand."""
    cfg = recorded_model_config(hand_record(5, {"window": 3, "global_every": 2}, {"kind": "swiglu"}))
    validate(cfg)
    assert windows(cfg) == [3, None, 3, None, 3]
    assert model_config_dict(cfg)["layers"] == {
        "kinds": {"local": {}, "global": {"attention": {"window": None}}},
        "first": [],
        "pattern": ["local", "global"],
        "loop": {"start": 0, "end": None, "passes": 1, "inject": False},
        "shared": dataclasses.asdict(SharedConfig()),  # no shared blocks
    }
    assert count_params(cfg)["total"] == hand_params(5, [3 * D * F] * 5)
    T = 16
    assert kv_cache_bytes(cfg, T) == 4 * 2 * KV * HD * (3 * 3 + 2 * T)  # fp32 keys and values
    every_third = recorded_model_config(hand_record(5, {"window": 3, "global_every": 3}, {"kind": "swiglu"}))
    assert windows(every_third) == [3, 3, None, 3, 3]


def test_dense_layers_read_as_first_layers_of_the_experts_kind():
    """DeepSeek's dense_layers 2 over 3 layers: two layer kinds of one MLP of the experts' kind (geglu,
    its tanh and d_ff kept), then the MoE; counted by hand (a dense geglu of d_ff 3·d·F; a MoE layer its
    router E·d, E experts of 3·d·f and the shared one of 3·d·f)."""
    E, f = 4, 8
    moe = {"kind": "moe", "expert": "geglu", "approximate": "tanh", "n_experts": E, "top_k": 2, "expert_d_ff": f}
    cfg = recorded_model_config(hand_record(3, {}, {**moe, "n_shared_experts": 1, "dense_layers": 2}))
    validate(cfg)
    assert [(lc.mlp.kind, lc.mlp.approximate) for lc in layer_configs(cfg)] == [("geglu", "tanh")] * 2 + [
        ("moe", "tanh")
    ]
    assert (cfg.layers.first, cfg.layers.pattern, cfg.layers.kinds) == (
        ["dense", "dense"],
        [],
        {"dense": {"mlp": {"kind": "geglu"}}},
    )
    assert count_params(cfg)["total"] == hand_params(3, [3 * D * F] * 2 + [E * D + E * 3 * D * f + 3 * D * f])
    assert ignored(cfg) == []  # the MoE's fields stay read: the model's own MLP reads them


def test_layer_kinds_with_the_old_fields_combine_layer_by_layer():
    """A recorded layout of kinds beside global_every (on a kind) and dense_layers: each layer keeps its
    kind's parts, is global where its own window and global_every made it so, and dense where it was one of
    the first dense_layers of a MoE; kinds joined by name (``a_global``, ``b_dense``)."""
    layers = {
        "kinds": {"a": {"attention": {"window": 2, "global_every": 2}}, "b": {"attention": {"n_kv_head": 1}}},
        "first": ["b"],
        "pattern": ["a", "a", "b"],
    }
    moe = {"kind": "moe", "expert": "swiglu", "n_experts": 2, "top_k": 1, "expert_d_ff": 8, "dense_layers": 1}
    cfg = validate(recorded_model_config(hand_record(6, {}, moe, layers)))
    # layers 0 b (dense), 1 a ((1 + 1) % 2 = 0: global), 2 a (3 % 2 = 1: local), 3 b, 4 a (local), 5 a (global)
    assert [layer_kind(cfg, i) for i in range(6)] == ["b_dense", "a_global", "a", "b", "a", "a_global"]
    assert windows(cfg) == [None, None, 2, None, 2, None]
    assert [lc.mlp.kind for lc in layer_configs(cfg)] == ["swiglu"] + ["moe"] * 5
    assert [lc.attention.n_kv_head for lc in layer_configs(cfg)] == [1, KV, KV, 1, KV, KV]
    assert cfg.layers.kinds["b_dense"] == {"attention": {"n_kv_head": 1}, "mlp": {"kind": "swiglu"}}


def test_an_unreadable_layout_with_the_old_fields_is_refused_naming_it():
    layers = {"kinds": {"a": {}}, "first": ["missing"], "pattern": []}
    with pytest.raises(ConfigError) as err:
        recorded_model_config(hand_record(2, {"window": 2, "global_every": 2}, {"kind": "swiglu"}, layers))
    assert err.value.field == "model.layers"


def test_an_old_moe_export_loads_with_its_weights(tmp_path):
    """An export whose config says dense_layers 1, its tensors named as that version built them (layer 0 a
    SwiGLU, ``blocks.0.mlp.gate_up`` and ``down``; layer 1 the MoE): the same names load into the model it
    described, which computes the same logits."""
    moe = {"kind": "moe", "expert": "swiglu", "expert_d_ff": 8, "n_shared_experts": 1}
    old = hand_record(2, {}, {**moe, "n_experts": 4, "top_k": 2, "dense_layers": 1})  # routing written flat then
    dense = {"kinds": {"dense": {"mlp": {"kind": "swiglu"}}}, "first": ["dense"]}
    torch.manual_seed(0)
    today = {**moe, "routing": {"n_experts": 4, "top_k": 2}}
    model = build_model(to_model_config(hand_record(2, {}, today, dense))).eval()
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "head.weight"}  # tied
    assert {"blocks.0.mlp.gate_up.weight", "blocks.0.mlp.down.weight", "blocks.1.mlp.router.weight"} <= state.keys()
    path = tmp_path / "old.safetensors"
    save_file(state, str(path), metadata={CONFIG_KEY: json.dumps(old)})
    loaded = load_weights(path).eval()
    assert loaded.state_dict().keys() == model.state_dict().keys()
    idx = torch.randint(0, V, (1, 9))
    with torch.no_grad():
        assert torch.equal(loaded(idx), model(idx))


def test_an_old_gemma2_checkpoint_continues_under_the_same_command(tmp_path):
    """A checkpoint of gemma2-2b (shrunk) as an earlier version recorded it, window + global_every 2, is
    the model today's preset composes (its every_other_global layout)."""
    overrides = ["model=gemma2-2b", "model.n_layer=3", "model.d_model=64", "model.vocab_size=64"]
    cfg = compose_model(overrides)
    old = model_config_dict(cfg)
    old["layers"] = {"kinds": None, "first": [], "pattern": []}
    old["attention"]["global_every"] = 2
    path = tmp_path / "old.ckpt"
    torch.save({"hyper_parameters": {"model": old}, "global_step": 3}, path)
    assert check_checkpoint(path, model_config_dict(cfg)) == 3


def test_the_old_fields_at_their_defaults_read_as_no_layer_kinds():
    """Every earlier config wrote both fields, at null and 0 where no layer differed (a sweep's run records
    as the report reads them): they go, and nothing else changes."""
    cfg = compose_model(["model=nano", "model/mlp=moe", "model.n_layer=2"])
    old = model_config_dict(cfg)
    old["attention"]["global_every"], old["mlp"]["dense_layers"] = None, 0
    assert recorded_model_config(old) == cfg

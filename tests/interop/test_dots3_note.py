"""Hugging Face parity of dots.3-note's language model (archlab/interop/families/dots3_note.py, model_type
dots3_note_text): DeepSeek-V3's latent attention with scaled latents, a normed shared rotated key and a gate
per head (mla's ``latent_scale``, ``rope_key_norm``, ``gate`` head) in full, sliding (heads, ranks and head
sizes of their own, ``per_layer_config``) and indexed layers (``dsa``), each type its RoPE base, over
DeepSeek-V3's routing with shared experts and a dense first layer.

Tiny random models (every parameter and buffer redrawn: the norms' scales, the indexer's LayerNorm, the
correction biases) give HF eager's float32 logits in archlab, map back to dots.3-note, round-trip bit for bit,
generate as HF does (left-padded too, past the window) and go through save_pretrained directories; the
default config's count is transformers'; what archlab cannot hold is refused both ways, naming the field."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab import count_params
from archlab.config.layers import layer_configs
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

TYPES = ["indexed_attention", "sliding_attention", "full_attention", "indexed_attention", "sliding_attention"]
MLA = dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8)
MLA |= dict(qk_rope_head_dim=8, v_head_dim=12, head_dim=16)
# the sliding layers: 2 heads of 12 + 4 (v 10), ranks 16 and 24 (the released ones: 64 heads, kv rank 1024)
SLIDING = dict(num_attention_heads=2, num_key_value_heads=2, q_lora_rank=16, kv_lora_rank=24, qk_nope_head_dim=12)
SLIDING |= dict(qk_rope_head_dim=4, v_head_dim=10, head_dim=16)
# 16 indexer heads of 16, each query keeping 4 keys (deepseek_v32's test: 8 heads tie at the top-4 boundary)
INDEXER = dict(index_n_heads=16, index_head_dim=16, index_topk=4)
MOE = dict(intermediate_size=96, moe_intermediate_size=32, shared_experts_intermediate_size=32, n_routed_experts=8)
MOE |= dict(num_experts_per_tok=3, n_shared_experts=1, n_group=2, topk_group=1, routed_scaling_factor=2.5)
ROPE = {t: {"rope_type": "default", "rope_theta": theta} for t, theta in
        (("indexed_attention", 800.0), ("sliding_attention", 50.0), ("full_attention", 300.0))}  # fmt: skip
KEYS = dict(HF_SIZES, num_hidden_layers=5, **NO_TOKENS, **MLA, **INDEXER, **MOE, rms_norm_eps=1e-5)
KEYS |= dict(layer_types=TYPES, sliding_window=4, rope_parameters=ROPE, mlp_layer_types=["dense"] + ["sparse"] * 4)
KEYS |= dict(per_layer_config={i: SLIDING for i, t in enumerate(TYPES) if t == "sliding_attention"})
# case -> (transformers model class, config class, config keys)
HF_CASES = {"dots3_note_text": ("Dots3NoteForCausalLM", "Dots3NoteTextConfig", KEYS)}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "dots3_note_text", seed, **EAGER)


globals().update(parity.family_tests(hf_model, impl=EAGER, only=parity.MAPPED_TESTS))


def test_from_hf_reads_each_layer_type():
    """Layer 0 indexed and dense, then indexed, sliding and full layers, each type its sizes and RoPE base."""
    cfg = from_hf(hf_model()).cfg
    layers = layer_configs(cfg)
    assert [lc.attention.kind for lc in layers] == ["dsa", "mla", "mla", "dsa", "mla"]
    assert [lc.attention.window for lc in layers] == [None, 4, None, None, 4]
    assert [lc.attention.n_head for lc in layers] == [4, 2, 4, 4, 2]
    assert [lc.position.theta for lc in layers] == [800.0, 50.0, 300.0, 800.0, 50.0]
    assert [lc.mlp.kind for lc in layers] == ["swiglu", "moe", "moe", "moe", "moe"]
    a = layers[1].attention
    assert (a.q_lora_rank, a.kv_lora_rank, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim) == (16, 24, 12, 4, 10)
    assert all((lc.attention.latent_scale, lc.attention.rope_key_norm, lc.attention.gate) == (True, True, "head")
               for lc in layers)  # fmt: skip


def everywhere(cfg, **fields):
    """``cfg`` with the attention ``fields`` set on the model and on each kind that swaps in its own attention."""
    changed = parity.changed_cfg(cfg, **{f"attention__{k}": v for k, v in fields.items()})
    for kind in changed.layers.kinds.values():
        kind.get("attention", {}).update(fields)
    return changed


def test_each_part_moves_the_logits():
    """The latent scale, the indexer's choice (every key kept instead) and the sliding layers' window each
    change the logits: the parity above compared them (the rotated key's norm: tests/test_mla_options.py)."""
    model = from_hf(hf_model()).eval()
    parity.check_changes_logits(model, everywhere(model.cfg, latent_scale=False), "latent_scale")
    parity.check_changes_logits(model, parity.changed_cfg(model.cfg, attention__index_topk=12), "index_topk")
    parity.check_changes_logits(model, parity.changed_cfg(model.cfg, kinds__sliding__attention__window=8), "window")


def test_the_closed_form_count_is_transformers_count_on_the_default_config():
    """The default Dots3NoteTextConfig (46 layers: indexed and sliding, 256 experts): 279,551,718,016
    parameters, archlab's closed form and transformers' meta build alike."""
    config = transformers.Dots3NoteTextConfig()
    with torch.device("meta"):
        hf = transformers.Dots3NoteForCausalLM(config)
    total = sum(p.numel() for p in hf.parameters())
    assert total == count_params(config_from_hf(config))["total"] == 279_551_718_016
    assert config_to_hf(config_from_hf(config)).layer_types == config.layer_types


def test_the_mtp_layers_of_a_checkpoint_are_left_out(tmp_path):
    """A checkpoint's multi-token prediction layer (``model.layers.<n>.*``), which transformers leaves
    unread, is left out: load_hf_dir gives HF's logits."""
    from safetensors.torch import load_file, save_file

    from archlab.interop.hf import load_hf_dir

    hf = hf_model()
    hf.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["model.layers.5.input_layernorm.weight"] = torch.full((64,), 3.0)
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert parity.max_diff(parity.logits(load_hf_dir(tmp_path)), parity.logits(hf)) <= 1e-4


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(attention_bias=True), "Dots3NoteTextConfig.attention_bias"),
        (dict(shared_experts_intermediate_size=48), "Dots3NoteTextConfig.shared_experts_intermediate_size"),
        (dict(mlp_layer_types=["sparse", "dense", "sparse", "sparse", "sparse"]), "Dots3NoteTextConfig.mlp_layer_types"),
        (dict(per_layer_config={i: dict(SLIDING, rms_norm_eps=1e-6) for i in (1, 4)}), "Dots3NoteTextConfig.per_layer_config"),
        (dict(rope_parameters=dict(ROPE, full_attention={"rope_type": "linear", "rope_theta": 300.0, "factor": 2.0})),
         "Dots3NoteTextConfig.rope_parameters.full_attention.rope_type"),
    ],
)  # fmt: skip
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "dots3_note_text", **changes)), field)


def layout():
    return from_hf(hf_model()).cfg


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda cfg: setattr(cfg.attention, "latent_scale", False), "model.attention.latent_scale"),
        (lambda cfg: setattr(cfg.attention, "gate", "elementwise"), "model.attention.gate"),
        (lambda cfg: setattr(cfg.attention, "index_pairing", "half"), "model.attention.index_pairing"),
        (lambda cfg: setattr(cfg.attention, "window", 6), "model.attention.window"),
        (lambda cfg: cfg.layers.kinds["full"]["attention"].update(window=6), "model.layers.kinds.full.attention.n_head"),
        (lambda cfg: cfg.layers.kinds["full"].update(position={"theta": 300.0, "pairing": "half"}),
         "model.layers.kinds.full.position.pairing"),
        (lambda cfg: setattr(cfg.mlp, "n_shared_experts", 0), "model.mlp.n_shared_experts"),
    ],
)  # fmt: skip
def test_the_record_refuses_what_the_class_cannot_hold(change, field):
    cfg = layout()
    change(cfg)
    assert field in {p.field for p in FAMILIES["dots3_note_text"].problems(cfg)}


def test_deepseek_layouts_are_not_dots3_notes():
    """DeepSeek-V3.2's preset (dsa without the scaled latents, the normed rotated key and the gate) is refused
    by this record naming the first, so it exports as DeepSeek-V3.2 still."""
    from archlab import compose_model

    cfg = compose_model(["model=deepseek-v3.2-exp"])
    assert "model.attention.latent_scale" in {p.field for p in FAMILIES["dots3_note_text"].problems(cfg)}


def test_archlab_to_hf_to_archlab_is_bit_identical():
    """An archlab model of the layout read, every weight redrawn by archlab: to Dots3NoteForCausalLM with the
    same logits, and back with every tensor bit for bit."""
    parity.check_exports(layout(), "Dots3NoteForCausalLM", family="dots3_note_text", **EAGER)

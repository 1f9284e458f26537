"""Hugging Face parity of Gemma 3n (text) (archlab/interop/families/gemma3n.py, model_type gemma3n_text):
sandwich layers of sliding and full attention with plain norm scales, value norms and unscaled scores, the last
layers sharing the keys and values of the last earlier layer of their type, per-layer input embeddings (a table
smaller than the vocabulary: the tokens past it read row 0), AltUp's copies of the hidden state, LAuReL beside
attention, an MLP width per layer and the first layers' activation sparsity.

Tiny random models (every parameter redrawn: matrices N(0, 0.2²), vectors 0.5 + N(0, 0.3²); HF's buffers are
constants of its config) give HF's float32 eager logits; archlab -> HF -> archlab is bit-identical; greedy
generation, past the window of 4 and through the shared layers' KV cache, and left-padded batches equal HF
``generate``; a save_pretrained directory reads back; what the family cannot hold is refused both ways; the
closed form counts transformers' default Gemma3nTextConfig as transformers builds it."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, HF_SIZES, NO_TOKENS, WIDTHS, WINDOW

from archlab import build_model, count_params
from archlab.config import ModelConfig
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, from_hf
from archlab.nn.validation import ignored

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

S, F = "sliding_attention", "full_attention"
ROPE = {S: {"rope_type": "default", "rope_theta": 100.0}, F: {"rope_type": "default", "rope_theta": 1000.0}}
BASE = dict(
    HF_SIZES,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    sliding_window=WINDOW,
    laurel_rank=4,
    rope_parameters=ROPE,
    **NO_TOKENS,
)
HF_CASES = {
    # E2B's parts: sliding, full, sliding, full, the last two sharing KV and twice as wide, the first sparse;
    # per-layer inputs from a table of 80 rows (tokens 80..95 read row 0); 3 AltUp copies; capped logits
    "gemma3n": (
        "Gemma3nForCausalLM",
        "Gemma3nTextConfig",
        dict(
            BASE,
            num_hidden_layers=4,
            layer_types=[S, F, S, F],
            intermediate_size=[48, 48, 96, 96],
            activation_sparsity_pattern=[0.95, 0.0, 0.0, 0.0],
            num_kv_shared_layers=2,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=80,
            altup_num_inputs=3,
            final_logit_softcapping=5.0,
        ),
    ),
    # no sharing; two sparsities, attention biases, an untied head, Gemma 3n's 4 copies, a full table
    "gemma3n-plain": (
        "Gemma3nForCausalLM",
        "Gemma3nTextConfig",
        dict(
            BASE,
            num_hidden_layers=3,
            layer_types=[S, S, F],
            intermediate_size=48,
            activation_sparsity_pattern=[0.95, 0.6, 0.0],
            num_kv_shared_layers=0,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=96,
            attention_bias=True,
            tie_word_embeddings=False,
        ),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES))


# an archlab layout of Gemma 3n's parts: Gemma 4's (gemma3-1b's shrunk, plain norm scales, value norms,
# unscaled scores, per-layer inputs) with AltUp's 2 copies and LAuReL of rank 8; local (sparse), global, then
# both again sharing the keys and values of the first two with MLPs twice as wide
LAYOUT = [
    "model=gemma3-1b",
    *WIDTHS,
    "model.n_layer=4",
    "model.attention.head_dim=16",
    "model.norm.unit_offset=false",
    "model.attention.v_norm=true",
    "model.attention.scale=1.0",
    "model.per_layer_input.dim=8",
    "model/stream=altup",
    "model.stream.n=2",
    "model.block.laurel_rank=8",
    "model.head.softcap=30.0",
]


KINDS: dict = dict(
    pattern=["local", "global", "local_shared", "global_shared"],
    local={"attention": {"window": WINDOW}, "mlp": {"activation_sparsity": 0.9}},
    global_={"attention": {"window": None}, "position": {"theta": 1e3}},
    local_shared={"attention": {"window": WINDOW, "kv_shared": True}, "position": {"theta": 1e4}, "mlp": {"d_ff": 192}},
    global_shared={"attention": {"window": None, "kv_shared": True}, "position": {"theta": 1e3}, "mlp": {"d_ff": 192}},
)


def layout(**changes) -> ModelConfig:
    return parity.with_kinds(parity.with_kinds(parity.composed(*LAYOUT), **KINDS), **changes)


def test_the_family_s_parts_read_from_the_config():
    """Layer 0's parts as the model's own (its sparsity among them); the full layers' window and RoPE, the
    shared layers' kv_shared and width, the dense layers' sparsity 0 in their kinds; AltUp, LAuReL and the
    per-layer table of its own size."""
    cfg = config_from_hf(parity.hf_config(HF_CASES, "gemma3n"))
    assert ignored(cfg) == []
    a = cfg.attention
    assert (a.window, a.head_dim, a.n_kv_head, a.v_norm, a.scale, a.qk_norm) == (WINDOW, 16, 2, True, 1.0, "head")
    assert (cfg.block.kind, cfg.block.laurel_rank, cfg.norm.unit_offset) == ("sandwich", 4, False)
    assert (cfg.stream.kind, cfg.stream.n, cfg.stream.coef_clip) == ("altup", 3, 120.0)
    assert (cfg.mlp.kind, cfg.mlp.approximate, cfg.mlp.d_ff, cfg.mlp.activation_sparsity) == ("geglu", "tanh", 48, 0.95)
    assert (cfg.per_layer_input.dim, cfg.per_layer_input.vocab) == (8, 80)
    assert cfg.layers.pattern == ["local_sparse", "global", "local_shared_96", "global_shared_96"]
    assert cfg.layers.kinds["global"]["mlp"] == {"activation_sparsity": 0.0}
    assert cfg.layers.kinds["local_shared_96"] == {
        "attention": {"kv_shared": True},
        "mlp": {"d_ff": 96, "activation_sparsity": 0.0},
    }


def test_the_tokens_past_the_per_layer_table_read_its_first_row():
    """Ids 80..95 past the 80-row table: archlab's logits equal HF's, which reads row 0 for them; a table
    whose row 0 changes moves them."""
    import torch

    hf = hf_model("gemma3n", seed=3)
    ids = torch.arange(80, 96).view(2, 8)
    model = from_hf(hf)
    assert parity.max_diff(parity.logits(hf, ids), parity.logits(model, ids)) <= parity.TOL
    with torch.no_grad():
        model.per_layer_inputs.table.weight[0] += 1.0
    assert parity.max_diff(parity.logits(hf, ids), parity.logits(model, ids)) > 1e-3


def test_the_sparsity_and_laurel_move_the_logits():
    """The model read with layer 0 dense, or with LAuReL's branch zeroed (its right matrix at 0: the stream
    then (x + attn + n)/√2, not x + attn), gives other logits: each part is run."""
    import torch

    model = from_hf(hf_model("gemma3n", seed=5))
    parity.check_changes_logits(model, parity.changed_cfg(model.cfg, mlp__activation_sparsity=0.0), "sparsity")
    before = parity.logits(model)
    with torch.no_grad():
        for block in model.blocks:
            block.laurel.right.weight.zero_()
    assert parity.max_diff(parity.logits(model), before) > 1e-3


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(altup_active_idx=1), "Gemma3nTextConfig.altup_active_idx"),
        (dict(altup_correct_scale=False), "Gemma3nTextConfig.altup_correct_scale"),
        (dict(laurel_rank=0), "Gemma3nTextConfig.laurel_rank"),
        (dict(hidden_size_per_layer_input=0), "Gemma3nTextConfig.hidden_size_per_layer_input"),
        (dict(hidden_activation="relu"), "Gemma3nTextConfig.hidden_activation"),
        (
            dict(rope_parameters={**ROPE, F: {"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0}}),
            "Gemma3nTextConfig.rope_parameters.full_attention.rope_type",
        ),
    ],
)  # fmt: skip
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "gemma3n", **changes)), field)


def test_archlab_to_hf_to_archlab_is_bit_identical():
    """The layout converts to Gemma3nForCausalLM with the same logits, and back with every tensor bit for bit
    and every layer's window and position scheme."""
    model, hf = parity.check_exports(layout(), "Gemma3nForCausalLM", family="gemma3n_text", **ATTN)
    assert hf.config.kv_sharing_modes == ["store", "store", "reuse", "reuse"]
    assert hf.config.activation_sparsity_pattern == [0.9, 0.0, 0.0, 0.0]
    assert hf.config.intermediate_size == [96, 96, 192, 192]
    parity.check_layers_kept(model.cfg, from_hf(hf).cfg)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(model={"stream": {"n": 2, "coef_clip": None}}), "model.stream.coef_clip"),
        (dict(model={"head": {"softcap": None}}), "model.head.softcap"),
        (dict(model={"block": {"laurel_rank": 0}}), "model.block.laurel_rank"),
        (dict(model={"per_layer_input": {"dim": 0}}), "model.per_layer_input.dim"),
        (dict(local={"block": {"laurel_rank": 4}}), "model.layers.kinds.local.block.laurel_rank"),
        # a shared layer before one of its own
        (dict(pattern=["local", "local_shared", "global", "global_shared"]), "model.attention.kv_shared"),
        # the shared layers' type produced by no earlier layer
        (dict(pattern=["local", "local", "global_shared", "global_shared"]),
         "model.layers.kinds.global_shared.attention.kv_shared"),
        (dict(global_={"attention": {"n_kv_head": 1}}), "model.layers.kinds.global.attention.n_kv_head"),
        (dict(model={"norm": {"unit_offset": True}}), "model.norm.unit_offset"),
        (dict(model={"attention": {"v_norm": False}}), "model.attention.v_norm"),
    ],
)  # fmt: skip
def test_the_family_refuses_what_it_cannot_express(changes, field):
    parity.check_family_refuses("gemma3n_text", layout(**changes), field)


def test_a_plain_stream_is_refused_and_gemma4_refuses_gemma3n_s_parts():
    """Without AltUp Gemma 3n names the stream; Gemma 4, whose other parts the layout has, names AltUp, LAuReL
    and the sparse layer's kind."""
    plain = parity.with_kinds(parity.composed(*(o for o in LAYOUT if "stream" not in o)), **KINDS)
    parity.check_family_refuses("gemma3n_text", plain, "model.stream.kind")
    found = {p.field for p in FAMILIES["gemma4_text"].problems(layout())}
    assert {"model.stream.kind", "model.block.laurel_rank", "model.layers.kinds.local.mlp.activation_sparsity"} <= found


@pytest.mark.parametrize("case", ["gemma3n"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **ATTN)


def test_the_closed_form_count_is_transformers_count_at_full_size():
    """archlab's count of Gemma3nTextConfig()'s defaults (E4B: 35 layers of d 2048, 4 AltUp copies, LAuReL of
    64, per-layer inputs of 256 from 262,144 rows, 15 shared layers) equals the parameters transformers builds
    and the model archlab builds, both on the meta device."""
    import torch

    config = transformers.Gemma3nTextConfig()
    with torch.device("meta"):
        hf = transformers.Gemma3nForCausalLM(config)
    cfg = config_from_hf(config)
    total = count_params(cfg)["total"]
    assert total == sum(p.numel() for p in hf.parameters())
    assert total == sum(p.numel() for p in build_model(cfg, device="meta").parameters())


def _wrapper(monkeypatch, seed: int = 1):
    """Gemma3nForConditionalGeneration of the "gemma3n" case's text config beside a tiny audio tower, every
    parameter redrawn; its vision tower (a timm model, which needs timm) an empty module: text alone never
    reads it."""
    import torch
    from transformers.models.gemma3n import modeling_gemma3n

    class Auto:
        @staticmethod
        def from_config(config, **kwargs):
            if isinstance(config, transformers.Gemma3nVisionConfig):
                return torch.nn.Module()
            return transformers.AutoModel.from_config(config, **kwargs)

    monkeypatch.setattr(modeling_gemma3n, "AutoModel", Auto)
    audio = dict(hidden_size=32, conf_num_attention_heads=2, conf_num_hidden_layers=1, input_feat_size=16)
    config = transformers.Gemma3nConfig(
        text_config=HF_CASES["gemma3n"][2],
        audio_config=dict(audio, sscp_conv_channel_size=[8, 4]),
        vision_config=dict(hidden_size=32),
        **ATTN,
    )
    return parity.randomize(transformers.Gemma3nForConditionalGeneration(config), seed)


def test_the_multimodal_wrapper_reads_as_its_language_model(monkeypatch, tmp_path, caplog):
    """Gemma3nForConditionalGeneration's logits on text alone; one logged line leaving out its towers and
    multimodal embedders; to_hf gives Gemma3nForCausalLM with the same logits, read back bit for bit; its
    save_pretrained directory loads the same."""
    import logging

    from archlab.interop.hf import load_hf_dir, to_hf

    hf = _wrapper(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="archlab.interop"):
        model = from_hf(hf)
    assert parity.max_diff(parity.logits(hf), parity.logits(model)) <= parity.TOL
    lines = [r.getMessage() for r in caplog.records if r.name == "archlab.interop"]
    assert len(lines) == 1 and lines[0].endswith("(model.audio_tower, model.embed_audio, model.embed_vision)")
    back = to_hf(model, **ATTN).eval()
    assert type(back).__name__ == "Gemma3nForCausalLM"
    assert parity.max_diff(parity.logits(back), parity.logits(hf)) <= parity.TOL
    parity.assert_same_tensors(model, from_hf(back))
    hf.save_pretrained(tmp_path / "wrapper")
    loaded = load_hf_dir(tmp_path / "wrapper").eval()
    assert parity.max_diff(parity.logits(hf), parity.logits(loaded)) <= parity.TOL

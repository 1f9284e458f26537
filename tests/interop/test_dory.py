"""Hugging Face parity of NVIDIA's Dory (archlab/interop/families/dory.py, model_type dory): nGPT blocks (L2 norms,
learned rates), unit q/k scaled by sqk, a scaled output gate and L2-normed attention output, the suv MLP with its
product L2-normed, learned logit scales, sliding and full layers each with their own RoPE, and the middle layers
looped with the input injected at each pass, each pass with its own KV cache.

A tiny random model (every parameter redrawn: matrices N(0, 0.2²), vectors, the scaled parameters among them,
0.5 + N(0, 0.3²); initializer_range 1 so the used scales stay near 1; GQA; four layers, the middle two run three
times; sequences longer than the window of 4) gives the same float32 logits in archlab and in transformers'
eager implementation; archlab -> HF -> archlab gives back every tensor bit for bit; greedy decoding, alone and
in a left-padded batch, equals HF ``generate``; a save_pretrained directory loads and saves again; what archlab
cannot hold is refused, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, SMALL, WINDOW

from archlab.config.loop import schedule
from archlab.interop.hf import config_from_hf, from_hf, load_hf_dir

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

HF_CASES = {
    # layers 0-2 sliding, 3 full (Dory's default layer_types); layer 0 once, 1-2 three times, 3 once
    "dory": (
        "DoryForCausalLM",
        "DoryConfig",
        dict(
            SMALL,
            num_hidden_layers=4,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=WINDOW,
            initializer_range=1.0,
            ngpt_alpha_init=0.5,
            n_input_layers=1,
            n_output_layers=1,
            n_recurrent_loops=3,
        ),
    ),
    # tied embeddings, MLP biases, the middle run once (no loop: every layer once, the injection a no-op)
    "dory_tied_once": (
        "DoryForCausalLM",
        "DoryConfig",
        dict(
            SMALL,
            num_hidden_layers=3,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=WINDOW,
            initializer_range=1.0,
            ngpt_alpha_init=0.5,
            n_input_layers=1,
            n_output_layers=1,
            n_recurrent_loops=1,
            tie_word_embeddings=True,
            mlp_bias=True,
        ),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


globals().update(parity.family_tests(hf_model, HF_CASES, only=parity.MAPPED_TESTS))


def test_from_hf_reads_the_loop_and_the_layers():
    """Layers 1-2 looped three times with the input injected (eight deep), three local layers and a global."""
    cfg = config_from_hf(parity.hf_config(HF_CASES, "dory"))
    loop = cfg.layers.loop
    assert (loop.start, loop.end, loop.passes, loop.inject) == (1, 3, 3, True)
    assert [layer for layer, _ in schedule(cfg)] == [0, 1, 2, 1, 2, 1, 2, 3]
    assert [w for w, *_ in parity.layer_positions(cfg)] == [WINDOW, WINDOW, WINDOW, None]
    assert (cfg.block.kind, cfg.norm.kind, cfg.attention.kind, cfg.mlp.kind, cfg.head.kind) == (
        "ngpt",
        "l2",
        "ngpt",
        "ngpt",
        "ngpt",
    )


def test_the_injection_moves_the_logits():
    """Without the injection (each pass from the last one's output alone) the logits move: the part is held."""
    model = from_hf(hf_model("dory"))
    x = parity.IDS
    before = parity.logits(model, x)
    model.loop.injected = None
    assert parity.max_diff(before, parity.logits(model, x)) > 1e-2


def test_last_loop_cache_is_refused():
    """recurrent_kv_cache_mode last_loop (earlier passes read the last pass's cache) is refused, naming it."""
    config = parity.hf_config(HF_CASES, "dory", recurrent_kv_cache_mode="last_loop")
    parity.check_refuses(lambda: config_from_hf(config), "DoryConfig.recurrent_kv_cache_mode", "per_loop")


def test_a_loop_without_injection_is_refused():
    cfg = config_from_hf(parity.hf_config(HF_CASES, "dory"))
    cfg.layers.loop.inject = False
    parity.check_family_refuses("dory", cfg, "model.layers.loop.inject")


def test_a_released_checkpoint_s_layer_pairs_load(tmp_path):
    """A checkpoint in the released layout (``backbone.``, ``embeddings``, ``g_proj``, each layer an attention
    half ``layers.2i.mixer`` and an MLP half ``layers.2i+1.mixer``, ``attn_alpha``/``mlp_alpha``; the config as
    DoryConfig writes it, the counts doubled) loads through load_hf_dir with transformers' logits, as
    transformers loads it."""
    import re

    from safetensors.torch import load_file, save_file

    hf = hf_model("dory", seed=5)
    hf.save_pretrained(tmp_path)
    (path,) = tmp_path.glob("*.safetensors")

    def released(name: str) -> str:
        m = re.match(r"backbone\.layers\.(\d+)\.(self_attn|mlp|lambda_1|lambda_2)(.*)", name)
        if m is None:
            return name
        i, part, rest = int(m[1]), m[2], m[3]
        half = {
            "self_attn": (0, "mixer"),
            "mlp": (1, "mixer"),
            "lambda_1": (0, "attn_alpha"),
            "lambda_2": (1, "mlp_alpha"),
        }
        j, new = half[part]
        return f"backbone.layers.{2 * i + j}.{new}{rest}"

    state = load_file(str(path))
    assert any(".g_proj." in k for k in state) and any(k.startswith("backbone.embeddings") for k in state)
    save_file({released(k): v for k, v in state.items()}, str(path), metadata={"format": "pt"})
    reloaded = transformers.DoryForCausalLM.from_pretrained(tmp_path, **ATTN)
    assert parity.max_diff(parity.logits(hf), parity.logits(reloaded)) == 0
    assert parity.max_diff(parity.logits(hf), parity.logits(load_hf_dir(tmp_path))) <= parity.TOL


# an archlab layout of Dory's parts, every scaled parameter's scale the init_std written as initializer_range
LAYOUT = [
    "model=nano",
    *parity.WIDTHS,
    "model.n_layer=4",
    "model.init_std=0.5",
    "model/position=rope",
    "model/norm=l2",
    "model.norm.eps=1e-6",
    "model/block=ngpt",
    "model.block.alpha_scale=0.5",
    "model/attention=ngpt",
    "model.attention.head_dim=16",
    "model.attention.qkv_bias=false",
    "model.attention.out_bias=false",
    "model.attention.scale=0.25",
    "model.attention.qk_scale_init=4.0",
    "model.attention.qk_scale_scale=0.5",
    "model.attention.gate=elementwise",
    f"model.attention.gate_scale_init={64**0.25!r}",
    "model.attention.gate_scale_scale=0.5",
    "model.attention.out_norm=true",
    "model/mlp=ngpt",
    "model.mlp.bias=false",
    "model.mlp.up_scale_init=8.0",
    "model.mlp.hidden_norm=true",
    "model/head=ngpt",
    "model.head.tied=false",
    "model.head.scale_scale=0.5",
    "model.layers.first=[local,local,local]",
    f"+model.layers.kinds.local.attention.window={WINDOW}",
    "model.layers.loop.start=1",
    "model.layers.loop.end=3",
    "model.layers.loop.passes=2",
    "model.layers.loop.inject=true",
]


def test_an_archlab_layout_exports_to_dory_and_back():
    """The layout maps to Dory, converts with the same logits, and back bit for bit with the same counts."""
    parity.check_exports(parity.composed(*LAYOUT), "DoryForCausalLM", "dory", 3, **ATTN)

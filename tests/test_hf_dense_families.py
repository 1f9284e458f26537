"""Per-family Hugging Face parity of the dense families beyond test_hf_conversion.py's GPT-2, GPT-J and
LLaMA: GPT-NeoX (Pythia), Phi, LLaMA with RoPE scaling, Mistral, Qwen2, Qwen3, Gemma, Gemma 2 and OLMo 2.

Tiny random models of each give the same float32 logits in archlab and in transformers' eager
implementation, from HF to archlab and from each archlab preset's layout to HF; archlab -> HF ->
archlab gives back every tensor bit for bit; greedy decoding equals HF ``generate``. Every parameter is
redrawn (matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²), far from 0 and 1), so a dropped,
transposed or swapped tensor shows in the logits. Sequences are longer than every sliding window (4)
and GQA is used wherever the family has it. The presets' configs are compared key by key with the
published ``config.json`` values in tests/helpers/published.py, whose transformers models, built on the meta
device, have the published parameter counts.
"""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import ATTN, CTX, HF_SIZES, NO_TOKENS, TOL, WINDOW, logits, max_diff, randomize
from helpers.published import HF_CONFIGS, PUBLISHED

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.config.layers import layer_configs
from archlab.interop.families.dense import dense_family
from archlab.interop.hf import FAMILIES, config_from_hf, config_to_hf, from_hf, hf_family, load_hf_dir

transformers = pytest.importorskip("transformers")


pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread


SMALL = dict(HF_SIZES, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, **NO_TOKENS)
# case -> (transformers model class, config class, config keys): each family, and its variants
HF_CASES = {
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(SMALL, rotary_pct=0.25, hidden_act="gelu")),
    "gpt_neox-sequential-tied": (
        "GPTNeoXForCausalLM",
        "GPTNeoXConfig",
        dict(
            SMALL,
            rotary_pct=0.5,
            rotary_emb_base=500.0,
            use_parallel_residual=False,
            attention_bias=False,
            tie_word_embeddings=True,
            hidden_act="gelu_new",
        ),
    ),
    "phi-gqa": ("PhiForCausalLM", "PhiConfig", dict(SMALL, num_key_value_heads=2, partial_rotary_factor=0.5)),
    "phi-qk-layernorm": ("PhiForCausalLM", "PhiConfig", dict(SMALL, qk_layernorm=True, partial_rotary_factor=0.75)),
    # original context 32: of the 8 wavelengths of a 16-dim head (2π·10⁴^(i/8)), 6.3 is kept, 19.9 blended and
    # the six from 62.8 on divided by the factor
    "llama-llama3-scaling": (
        "LlamaForCausalLM",
        "LlamaConfig",
        dict(
            SMALL,
            num_key_value_heads=2,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
    "llama-linear-scaling-biases": (
        "LlamaForCausalLM",
        "LlamaConfig",
        dict(
            SMALL,
            num_key_value_heads=1,
            attention_bias=True,
            mlp_bias=True,
            rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
        ),
    ),
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(SMALL, num_key_value_heads=2, sliding_window=WINDOW)),
    "qwen2": (
        "Qwen2ForCausalLM",
        "Qwen2Config",
        dict(
            SMALL,
            num_key_value_heads=2,
            use_sliding_window=True,
            sliding_window=WINDOW,
            max_window_layers=0,
            tie_word_embeddings=True,
        ),
    ),
    "qwen3": (
        "Qwen3ForCausalLM",
        "Qwen3Config",
        dict(
            SMALL,
            num_key_value_heads=2,
            head_dim=24,
            use_sliding_window=True,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(SMALL, num_key_value_heads=1, head_dim=32)),
    "gemma2": (
        "Gemma2ForCausalLM",
        "Gemma2Config",
        dict(
            SMALL,
            num_hidden_layers=3,
            num_key_value_heads=2,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=WINDOW,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=5.0,
        ),
    ),
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", dict(SMALL, num_key_value_heads=2)),
}


def windows(cfg) -> list:
    """Each layer's sliding window (None: a global layer)."""
    return [lc.attention.window for lc in layer_configs(cfg)]


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits(case):
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == hf.config.model_type  # the layout read maps back to the same family


def test_from_hf_reads_each_family_s_parts():
    cfgs = {case: from_hf(hf_model(case)).cfg for case in HF_CASES}
    neox, seq = cfgs["gpt_neox"], cfgs["gpt_neox-sequential-tied"]
    assert (neox.block.kind, neox.block.shared_norm, neox.position.rotary_fraction) == ("parallel", False, 0.25)
    assert (seq.block.kind, seq.position.theta, seq.attention.qkv_bias, seq.head.tied) == ("pre", 500.0, False, True)
    phi = cfgs["phi-gqa"]
    assert (phi.block.shared_norm, phi.attention.n_kv_head, phi.head.bias, phi.mlp.approximate) == (
        True,
        2,
        True,
        "tanh",
    )
    assert cfgs["phi-qk-layernorm"].attention.qk_norm == "head"
    p = cfgs["llama-llama3-scaling"].position.scaling
    assert (p.kind, p.factor, p.low_freq_factor, p.high_freq_factor, p.original_context) == (
        "llama3",
        8.0,
        1.0,
        4.0,
        32,
    )
    assert (
        cfgs["llama-linear-scaling-biases"].position.scaling.kind,
        cfgs["llama-linear-scaling-biases"].mlp.bias,
    ) == (
        "linear",
        True,
    )
    assert (cfgs["mistral"].attention.window, windows(cfgs["mistral"])) == (WINDOW, [WINDOW] * 2)
    q2 = cfgs["qwen2"].attention
    assert (q2.qkv_bias, q2.out_bias, q2.window, windows(cfgs["qwen2"])) == (True, False, WINDOW, [WINDOW] * 2)
    q3 = cfgs["qwen3"].attention
    assert (q3.qk_norm, q3.head_dim, windows(cfgs["qwen3"])) == ("head", 24, [WINDOW, None])
    gemma = cfgs["gemma"]
    assert (gemma.norm.unit_offset, gemma.scale_embedding, gemma.mlp.kind, gemma.mlp.approximate) == (
        True,
        True,
        "geglu",
        "tanh",
    )
    g2 = cfgs["gemma2"]
    assert (g2.block.kind, g2.attention.scale, g2.attention.softcap, g2.head.softcap) == (
        "sandwich",
        24**-0.5,
        2.0,
        5.0,
    )
    assert windows(g2) == [WINDOW, None, WINDOW]  # layers 0, 2 slide; 1 is global (model.layers kinds)
    assert (cfgs["olmo2"].block.kind, cfgs["olmo2"].attention.qk_norm) == ("post_sublayer", "full")


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_to_archlab_to_hf_and_back(case):
    """The archlab model converts back to the same HF class with the same logits, and from there to an
    archlab model with the same config and bit-identical tensors."""
    hf = hf_model(case, seed=2)
    parity.check_back_and_again(hf, from_hf(hf), **ATTN)


TINY = ["model.vocab_size=96", "model.context_length=64", "model.n_layer=2", "model.mlp.d_ff=96"]
D64 = ["model.d_model=64", "model.attention.n_head=4"]
GQA = [*D64, "model.attention.n_kv_head=2"]
# case -> (preset, the HF class it maps to, sizes): each new preset shrunk, its registry choices and
# features kept (windows of 4, smaller soft-caps), and variants the presets do not show
PRESET_CASES = {
    "pythia-160m": ("pythia-160m", "GPTNeoXForCausalLM", D64),
    # 30 of 44 dims: 44 · (30 / 44) is just below 30 in floating point, so the factor written is nudged up
    "pythia-160m-rotary-30-of-44": (
        "pythia-160m",
        "GPTNeoXForCausalLM",
        [
            "model.d_model=176",
            "model.attention.n_head=4",
            "model.position.rotary_fraction=null",
            "model.position.rotary_dim=30",
        ],
    ),
    "phi-2": ("phi-2", "PhiForCausalLM", ["model.d_model=80", "model.attention.n_head=4"]),  # 8 of 20 dims rotate
    "llama3.1-8b": ("llama3.1-8b", "LlamaForCausalLM", [*GQA, "model.position.scaling.original_context=32"]),
    "mistral-7b": ("mistral-7b", "MistralForCausalLM", [*GQA, f"model.attention.window={WINDOW}"]),
    "qwen2-0.5b": ("qwen2-0.5b", "Qwen2ForCausalLM", D64),
    "qwen2-0.5b-every-other-layer-global": (
        "qwen2-0.5b",
        "Qwen2ForCausalLM",
        [*D64, "model.n_layer=3", "model/layers=every_other_global", f"model.attention.window={WINDOW}"],
    ),
    "qwen3-0.6b": ("qwen3-0.6b", "Qwen3ForCausalLM", [*GQA, "model.attention.head_dim=24"]),
    "gemma-2b": ("gemma-2b", "GemmaForCausalLM", [*D64, "model.attention.head_dim=32"]),
    "gemma2-2b": (
        "gemma2-2b",
        "Gemma2ForCausalLM",
        [
            *D64,
            "model.n_layer=3",
            "model.attention.head_dim=16",
            f"model.attention.window={WINDOW}",
            "model.attention.softcap=2.0",
            "model.head.softcap=5.0",
        ],
    ),
    "gemma2-2b-no-window": (
        "gemma2-2b",
        "Gemma2ForCausalLM",
        [*D64, "model.attention.head_dim=16", "model.attention.window=null", "model/layers=none"],
    ),
    "olmo2-7b": ("olmo2-7b", "Olmo2ForCausalLM", GQA),
}


@pytest.mark.parametrize("case", list(PRESET_CASES))
def test_archlab_to_hf_to_archlab_is_bit_identical(case):
    """A shrunk preset converts to its family's HF class with the same logits (HF eager), and back to
    archlab with every tensor bit for bit."""
    preset, expected_class, sizes = PRESET_CASES[case]
    model = randomize(build_model(compose_model([f"model={preset}", *TINY, *sizes])), seed=3)
    parity.check_to_hf_and_back(model, expected_class, **ATTN)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_greedy_generation_matches_hf_generate(case):
    """20 new tokens after a 5-token prompt, past every window of 4: the same ids as HF ``generate``, and
    at every step archlab's logits through its KV cache equal the logits HF decoded with (a random model's
    greedy path may settle into a few tokens; the logits compare every step whatever it picks)."""
    hf = hf_model(case, seed=4)
    parity.check_greedy_generation(hf)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_padded_batch_generation_matches_hf_generate(case):
    """Prompts of 7, 3 and 5 tokens left-padded into one batch, with their attention mask: archlab's
    greedy continuation of each row, and its logits at every step, equal HF ``generate``'s on the same batch."""
    hf = hf_model(case, seed=6)
    parity.check_padded_generation(hf)


# ---------------------------------------------------------------- the presets against the published configs

_ROPE_KEYS = {"rope_theta", "rotary_pct", "rotary_emb_base", "partial_rotary_factor", "rope_scaling"}


def published_config(preset: str):
    model_type, keys = HF_CONFIGS[preset]
    return transformers.CONFIG_MAPPING[model_type](**keys)


@pytest.mark.parametrize("preset", list(HF_CONFIGS))
def test_published_config_built_by_transformers_has_the_published_count(preset):
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(published_config(preset))
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[preset]


@pytest.mark.parametrize("preset", list(HF_CONFIGS))
def test_preset_converts_to_the_published_config(preset):
    """Every published key (RoPE's as transformers files them in rope_parameters) equals the one
    config_to_hf writes for the preset, in the published family's config class."""
    published, _, keys = published_config(preset), *HF_CONFIGS[preset]
    ours = config_to_hf(compose_model([f"model={preset}"]))
    assert type(ours) is type(published)
    # implied keys too: the RoPE pairs DeepSeek-V3 rotates (its config.json leaves the default, interleaved)
    compared = [k for k in keys if k not in _ROPE_KEYS] + ["rope_parameters", "head_dim", "layer_types"]
    compared += ["rope_interleave"]

    def value(config, k):  # DeepSeek's config.json spells rope_type "type"; transformers keeps both
        v = getattr(config, k)
        return {n: x for n, x in v.items() if n != "type"} if k == "rope_parameters" else v

    differ = {
        k: (value(published, k), value(ours, k))
        for k in compared
        if hasattr(published, k) and value(published, k) != value(ours, k)
    }
    assert not differ


@pytest.mark.parametrize("preset", list(HF_CONFIGS))
def test_published_config_reads_into_the_preset_s_layout(preset):
    cfg = config_from_hf(published_config(preset))
    assert hf_family(cfg) == HF_CONFIGS[preset][0]
    assert count_params(cfg)["total"] == PUBLISHED[preset]
    assert config_to_hf(cfg).to_dict() == config_to_hf(compose_model([f"model={preset}"])).to_dict()


def test_phi2_s_two_dropout_rates_read_as_two_fields():
    """microsoft/phi-2 trained with resid_pdrop 0.1 and embd_pdrop 0.0: model.dropout 0.1 beside
    model.embedding_dropout 0.0, written back as the same two rates."""
    _, keys = HF_CONFIGS["phi-2"]
    cfg = config_from_hf(transformers.PhiConfig(**keys, resid_pdrop=0.1, embd_pdrop=0.0))
    assert (cfg.dropout, cfg.embedding_dropout) == (0.1, 0.0)
    back = config_to_hf(cfg)
    assert (type(back).__name__, back.resid_pdrop, back.embd_pdrop) == ("PhiConfig", 0.1, 0.0)


# ---------------------------------------------------------------- which family, and what is refused

FAMILY_OF = {
    "pythia-160m": "GPTNeoXConfig",
    "pythia-1.4b": "GPTNeoXConfig",
    "phi-1.5": "PhiConfig",
    "gptj-6b": "GPTJConfig",
    "llama3.1-8b": "LlamaConfig",
    "mistral-7b": "MistralConfig",
    "qwen2.5-7b": "Qwen2Config",
    "qwen3-8b": "Qwen3Config",
    "gemma-7b": "GemmaConfig",
    "gemma2-9b": "Gemma2Config",
    "olmo2-7b": "Olmo2Config",
}


@pytest.mark.parametrize(
    "overrides, config_class",
    [
        # each preset's own family
        *[([f"model={p}"], c) for p, c in FAMILY_OF.items()],
        # LLaMA plus biases on q/k/v only is Qwen2; plus a window on every layer, Mistral; plus per-head
        # QK-norm, Qwen3; a pre-norm LayerNorm with RoPE is GPT-NeoX without parallel residuals
        (["model=llama2-7b", "model.attention.qkv_bias=true"], "Qwen2Config"),
        (["model=llama2-7b", "model.attention.window=128"], "MistralConfig"),
        (["model=llama2-7b", "model.attention.qk_norm=head"], "Qwen3Config"),
        (["model=llama2-7b", "model.attention.qkv_bias=true", "model.attention.out_bias=true"], "LlamaConfig"),
        (["model=pythia-160m", "model/block=pre"], "GPTNeoXConfig"),
        (["model=qwen2-0.5b", "model.attention.window=128", "model/layers=every_other_global"], "Qwen2Config"),
    ],
)
def test_the_layout_picks_the_family(overrides, config_class):
    assert type(config_to_hf(compose_model(overrides))).__name__ == config_class


@pytest.mark.parametrize(
    "overrides, field",
    [
        # windows of two sizes route to Mistral (one window on every layer of it): it holds no layers
        (
            ["model=mistral-7b", "model/layers=every_other_global", "+model.layers.kinds.global.attention.window=8"],
            "model.layers.pattern",
        ),
        (
            ["model=gemma2-2b", "+model.layers.kinds.global.attention.window=8"],
            "model.layers.kinds.global.attention.window",
        ),
        (
            ["model=mistral-7b", "model.attention.qkv_bias=true", "model.attention.out_bias=true"],
            "model.attention.qkv_bias",
        ),
        (["model=gemma-2b", "model.norm.unit_offset=false"], "model.norm.unit_offset"),
        (["model=gemma-2b", "model.attention.softcap=50.0"], "model.attention.softcap"),
        (["model=gemma2-2b", "model.attention.scale=0.3"], "model.attention.scale"),
        (["model=gemma2-2b", "model.scale_embedding=false"], "model.scale_embedding"),
        (["model=olmo2-7b", "model.attention.qk_norm=head"], "model.attention.qk_norm"),
        (["model=olmo2-7b", "model.attention.qkv_bias=true"], "model.attention.out_bias"),
        (["model=qwen3-8b", "model.norm.unit_offset=true"], "model.scale_embedding"),  # (1 + w) alone: Gemma's half
        (["model=qwen2-0.5b", "model.mlp.bias=true"], "model.mlp.bias"),
        (["model=pythia-160m", "model.attention.n_kv_head=4"], "model.attention.n_kv_head"),
        (["model=pythia-160m", "model.attention.out_bias=false"], "model.attention.out_bias"),
        (["model=pythia-160m", "model.head.bias=true"], "model.head.bias"),
        (["model=pythia-160m", "model.position.pairing=interleaved"], "model.position.pairing"),
        (["model=phi-2", "model.attention.out_bias=false"], "model.attention.out_bias"),
        (["model=phi-2", "model.attention.qk_norm=full"], "model.attention.qk_norm"),
        (["model=phi-2", "model.attention.qk_norm=head", "model.attention.head_dim=40"], "model.attention.head_dim"),
        (["model=phi-2", "model.head.bias=false"], "model.head.bias"),
        (["model=llama3.1-8b", "model.dropout=0.1"], "model.dropout"),
        (["model=llama3.1-8b", "model.position.rotary_dim=64"], "model.position.rotary_dim"),
        (
            ["model=gptj-6b", "model.position.scaling.kind=linear", "model.position.scaling.factor=2.0"],
            "model.position.scaling.kind",
        ),
        (["model=gemma2-2b", "model/position=alibi"], "model.position.kind"),
        (["model=olmo2-7b", "model/block=post"], "model.block.kind"),
    ],
)
def test_the_family_a_layout_routes_to_refuses_what_it_cannot_hold(overrides, field):
    with pytest.raises(ConfigError) as err:
        FAMILIES[dense_family(cfg := compose_model(overrides)).model_type].check(cfg)
    assert err.value.field == field
    assert "Hugging Face" in str(err.value)


@pytest.mark.parametrize(
    "overrides, config_class",
    [
        # what Mistral and OLMo 2 refuse, another family holds exactly: the export goes there
        (["model=mistral-7b", "model.attention.qkv_bias=true", "model.attention.out_bias=true"], "SmolLM3Config"),
        (["model=olmo2-7b", "model.attention.qk_norm=head"], "Exaone4Config"),
        (["model=olmo2-7b", "model.attention.qkv_bias=true"], None),  # no family: OLMo 2 names its field
    ],
)
def test_a_layout_its_family_refuses_exports_to_a_family_that_holds_it(overrides, config_class):
    cfg = compose_model([*overrides, "model.n_layer=2"])
    if config_class is None:
        with pytest.raises(ConfigError) as err:
            config_to_hf(cfg)
        assert err.value.field == "model.attention.out_bias"
        return
    assert type(config_to_hf(cfg)).__name__ == config_class


def _hf_config(case: str, **changes):
    _, config_class, keys = HF_CASES[case]
    return getattr(transformers, config_class)(**{**keys, **changes})


@pytest.mark.parametrize(
    "case, changes, read",
    [
        ("qwen2", dict(max_window_layers=1), [None, WINDOW]),  # layer 0 global, layer 1 slides
        ("qwen3", dict(layer_types=["full_attention", "sliding_attention"]), [None, WINDOW]),
        (
            "gemma2",
            dict(layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
            [WINDOW, WINDOW, None],
        ),
    ],
)
def test_any_layers_sliding_read_as_layer_kinds(case, changes, read):
    """Which layers slide, in any order (once refused unless every N-th one was global), reads as model.layers
    kinds giving each layer its window, and writes back the same layer_types."""
    cfg = config_from_hf(_hf_config(case, **changes))
    assert windows(cfg) == read
    assert config_to_hf(cfg).layer_types == ["full_attention" if w is None else "sliding_attention" for w in read]


@pytest.mark.parametrize(
    "case, changes, field",
    [
        (
            "llama-llama3-scaling",
            dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}),
            "LlamaConfig.rope_parameters.rope_type",
        ),
        (
            "llama-llama3-scaling",
            dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
            "LlamaConfig.rope_parameters.partial_rotary_factor",
        ),
        ("gpt_neox", dict(rotary_pct=0.0625), "GPTNeoXConfig.rope_parameters.partial_rotary_factor"),  # 1 dim
        ("gpt_neox", dict(hidden_act="quick_gelu"), "GPTNeoXConfig.hidden_act"),
        ("qwen3", dict(layer_types=["full_attention", "chunked_attention"]), "Qwen3Config.layer_types"),
        ("gemma", dict(use_bidirectional_attention=True), "GemmaConfig.use_bidirectional_attention"),
        ("gemma2", dict(hidden_activation="relu"), "Gemma2Config.hidden_activation"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    with pytest.raises(ConfigError) as err:
        config_from_hf(_hf_config(case, **changes))
    assert err.value.field == field


def test_pythia_checkpoint_with_embed_out_loads(tmp_path):
    """Pythia's Hub checkpoints predate transformers 5: the head is ``embed_out``, and older ones carry
    ``attention.bias`` / ``attention.masked_bias`` mask buffers."""
    from safetensors.torch import save_file

    hf = hf_model("gpt_neox", seed=6)
    hf.config.save_pretrained(tmp_path)
    state = {
        ("embed_out." + k.removeprefix("lm_head.")) if k.startswith("lm_head.") else k: v.contiguous()
        for k, v in hf.state_dict().items()
    }
    for i in range(2):
        state[f"gpt_neox.layers.{i}.attention.bias"] = torch.tril(torch.ones(1, 1, CTX, CTX, dtype=torch.bool))
        state[f"gpt_neox.layers.{i}.attention.masked_bias"] = torch.tensor(-1e9)
    save_file(state, str(tmp_path / "model.safetensors"))
    assert max_diff(logits(hf), logits(load_hf_dir(tmp_path).eval())) <= TOL


@pytest.mark.parametrize("case", ["gpt_neox", "phi-qk-layernorm", "qwen3", "gemma2", "olmo2"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **ATTN)

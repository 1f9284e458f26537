"""Published layouts: parameter totals and Hugging Face configs, typed in by hand. Kept apart from
archlab/cli/check.py's copy of the totals on purpose: the tests check the code against this one.

PUBLISHED: each total is the parameter count of Hugging Face transformers' own model (5.23) of the
published config, built on the meta device, a tied tensor counted once (``interop/test_published.py``
rebuilds the newer ones from HF_CONFIGS below). Where the authors published an exact figure it agrees:
Pythia's model card table ("Naming convention and parameter count") gives 162,322,944 and
1,414,647,808; the Gemma and Gemma 2 papers (arXiv 2403.08295 and 2408.00118, table 2) give the same
non-embedding counts (their embedding rows count a 256,128-entry vocabulary, the released configs
256,000).

ACTIVE: the parameters one token goes through in the four mixtures of experts (every shared tensor, the
router and the top-k routed experts of each MoE layer), from the same meta builds: the total less
(E - k) experts in every MoE layer, as docs/reference.md describes it (tests/test_moe.py checks the
active count against one written out from the layer shapes). Mixtral's and Qwen3's agree with their
cards (12.9B, 3.3B); DeepSeek's cards
leave the input embedding out (2.4B, 36.6B = 37,552,282,624 - 129280·7168).

LAYOUT_CONFIGS: the presets whose layers differ (model.layers), held to the published config itself (not
to what a converter writes: not every such family has one), as the keyword arguments of its transformers
config class, built on the meta device by tests/test_presets.py. Their
ACTIVE counts are the same meta build's total less (E - k) routed experts in every MoE layer.

HF_CONFIGS: the architecture keys of each model's ``config.json`` on the Hugging Face Hub (repo named
per entry), as (model_type, keys); token ids, dtypes and dropout rates left out.
"""

PUBLISHED = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "gptj-6b": 6_050_882_784,
    "llama-7b": 6_738_415_616,
    "llama-13b": 13_015_864_320,
    "llama-65b": 65_285_660_672,
    "llama2-7b": 6_738_415_616,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "pythia-160m": 162_322_944,
    "pythia-1.4b": 1_414_647_808,
    "mistral-7b": 7_241_732_096,
    "qwen2-0.5b": 494_032_768,
    "qwen2.5-7b": 7_615_616_512,
    "qwen3-0.6b": 596_049_920,
    "qwen3-8b": 8_190_735_360,
    "phi-1.5": 1_418_270_720,
    "phi-2": 2_779_683_840,
    "gemma-2b": 2_506_172_416,
    "gemma-7b": 8_537_680_896,
    "gemma2-2b": 2_614_341_888,
    "gemma2-9b": 9_241_705_984,
    "olmo2-7b": 7_298_617_344,
    "llama3.1-8b": 8_030_261_248,
    "mixtral-8x7b": 46_702_792_704,
    "qwen3-30b-a3b": 30_532_122_624,
    "deepseek-v2-lite": 15_706_484_224,
    "deepseek-v3": 671_026_404_352,
    "gemma3-1b": 999_885_952,
    "gemma3-27b": 27_009_346_304,
    "smollm3-3b": 3_075_098_624,
    "step-3.5-flash": 196_956_118_272,
    "gpt-oss-20b": 20_914_757_184,
    "gpt-oss-120b": 116_829_156_672,
    "mamba-codestral-7b": 7_285_403_648,
    "xlstm-7b": 6_865_424_896,
    "llama4-scout-17b-16e": 107_769_861_120,
    "qwen3-next-80b-a3b": 79_674_391_296,
    "bamba-9b": 9_992_765_440,
    "recurrentgemma-2b": 2_682_862_080,
    "jamba-v0.1": 51_570_323_328,
    "kimi-linear-48b-a3b": 49_133_074_464,
    "deepseek-v3.2-exp": 671_877_929_216,
    "lfm3-1.7b": 1_728_801_536,
    "ling-3.0-flash": 124_414_191_072,
}

ACTIVE = {
    "mixtral-8x7b": 12_879_925_248,
    "qwen3-30b-a3b": 3_353_032_704,
    "deepseek-v2-lite": 2_661_150_208,
    "deepseek-v3": 37_552_282_624,
    "step-3.5-flash": 11_987_311_872,
    "gpt-oss-20b": 4_187_440_704,
    "gpt-oss-120b": 5_711_982_912,
    "llama4-scout-17b-16e": 17_172_894_720,
    "qwen3-next-80b-a3b": 3_874_929_408,
    "jamba-v0.1": 12_110_311_296,
    "kimi-linear-48b-a3b": 3_494_852_640,
    "deepseek-v3.2-exp": 38_403_807_488,
    "ling-3.0-flash": 5_505_672_672,
}

_PYTHIA = dict(
    vocab_size=50304,
    hidden_act="gelu",
    rotary_pct=0.25,
    rotary_emb_base=10000,
    max_position_embeddings=2048,
    layer_norm_eps=1e-5,
    use_parallel_residual=True,
    tie_word_embeddings=False,
)
_QWEN2 = dict(hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=131072)
_QWEN3 = dict(
    vocab_size=151936,
    head_dim=128,
    hidden_act="silu",
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    max_position_embeddings=40960,
    attention_bias=False,
    use_sliding_window=False,
)
_PHI = dict(
    vocab_size=51200,
    hidden_act="gelu_new",
    layer_norm_eps=1e-5,
    max_position_embeddings=2048,
    rope_theta=10000.0,
    qk_layernorm=False,
    tie_word_embeddings=False,
)
_GEMMA = dict(
    vocab_size=256000,
    head_dim=256,
    hidden_act="gelu",  # transformers reads Gemma's legacy "gelu" as its tanh approximation
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=8192,
    attention_bias=False,
)
_GEMMA2 = dict(
    vocab_size=256000,
    head_dim=256,
    hidden_activation="gelu_pytorch_tanh",
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=8192,
    attention_bias=False,
    query_pre_attn_scalar=256,
    sliding_window=4096,
    attn_logit_softcapping=50.0,
    final_logit_softcapping=30.0,
)

HF_CONFIGS = {
    # EleutherAI/pythia-160m, EleutherAI/pythia-1.4b
    "pythia-160m": (
        "gpt_neox",
        dict(_PYTHIA, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    ),
    "pythia-1.4b": (
        "gpt_neox",
        dict(_PYTHIA, hidden_size=2048, num_hidden_layers=24, num_attention_heads=16, intermediate_size=8192),
    ),
    # mistralai/Mistral-7B-v0.1
    "mistral-7b": (
        "mistral",
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            hidden_act="silu",
            max_position_embeddings=32768,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            sliding_window=4096,
            tie_word_embeddings=False,
        ),
    ),
    # Qwen/Qwen2-0.5B, Qwen/Qwen2.5-7B (use_sliding_window false: their sliding_window is unused)
    "qwen2-0.5b": (
        "qwen2",
        dict(
            _QWEN2,
            vocab_size=151936,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            use_sliding_window=False,
            sliding_window=131072,
            max_window_layers=24,
        ),
    ),
    "qwen2.5-7b": (
        "qwen2",
        dict(
            _QWEN2,
            vocab_size=152064,
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            tie_word_embeddings=False,
            use_sliding_window=False,
            sliding_window=131072,
            max_window_layers=28,
        ),
    ),
    # Qwen/Qwen3-0.6B, Qwen/Qwen3-8B
    "qwen3-0.6b": (
        "qwen3",
        dict(
            _QWEN3,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            tie_word_embeddings=True,
        ),
    ),
    "qwen3-8b": (
        "qwen3",
        dict(
            _QWEN3,
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            tie_word_embeddings=False,
        ),
    ),
    # microsoft/phi-1_5, microsoft/phi-2
    "phi-1.5": (
        "phi",
        dict(
            _PHI,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=24,
            num_attention_heads=32,
            num_key_value_heads=32,
            partial_rotary_factor=0.5,
        ),
    ),
    "phi-2": (
        "phi",
        dict(
            _PHI,
            hidden_size=2560,
            intermediate_size=10240,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            partial_rotary_factor=0.4,
        ),
    ),
    # google/gemma-2b, google/gemma-7b (tie_word_embeddings absent: GemmaConfig's default, true)
    "gemma-2b": (
        "gemma",
        dict(
            _GEMMA,
            hidden_size=2048,
            intermediate_size=16384,
            num_hidden_layers=18,
            num_attention_heads=8,
            num_key_value_heads=1,
        ),
    ),
    "gemma-7b": (
        "gemma",
        dict(
            _GEMMA,
            hidden_size=3072,
            intermediate_size=24576,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=16,
        ),
    ),
    # google/gemma-2-2b, google/gemma-2-9b (layer_types absent: sliding on even layers, global on odd)
    "gemma2-2b": (
        "gemma2",
        dict(
            _GEMMA2,
            hidden_size=2304,
            intermediate_size=9216,
            num_hidden_layers=26,
            num_attention_heads=8,
            num_key_value_heads=4,
        ),
    ),
    "gemma2-9b": (
        "gemma2",
        dict(
            _GEMMA2,
            hidden_size=3584,
            intermediate_size=14336,
            num_hidden_layers=42,
            num_attention_heads=16,
            num_key_value_heads=8,
        ),
    ),
    # allenai/OLMo-2-1124-7B
    "olmo2-7b": (
        "olmo2",
        dict(
            vocab_size=100352,
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            hidden_act="silu",
            max_position_embeddings=4096,
            rms_norm_eps=1e-6,
            rope_theta=500000.0,
            attention_bias=False,
            tie_word_embeddings=False,
        ),
    ),
    # meta-llama/Llama-3.1-8B
    "llama3.1-8b": (
        "llama",
        dict(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            hidden_act="silu",
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            attention_bias=False,
            mlp_bias=False,
            tie_word_embeddings=False,
        ),
    ),
    # mistralai/Mixtral-8x7B-v0.1
    "mixtral-8x7b": (
        "mixtral",
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            num_local_experts=8,
            num_experts_per_tok=2,
            hidden_act="silu",
            max_position_embeddings=32768,
            rms_norm_eps=1e-5,
            rope_theta=1000000.0,
            sliding_window=None,
            router_aux_loss_coef=0.02,
            tie_word_embeddings=False,
        ),
    ),
    # Qwen/Qwen3-30B-A3B (intermediate_size is unused: no layer is dense)
    "qwen3-30b-a3b": (
        "qwen3_moe",
        dict(
            _QWEN3,
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_hidden_layers=48,
            num_attention_heads=32,
            num_key_value_heads=4,
            num_experts=128,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            router_aux_loss_coef=0.001,
            tie_word_embeddings=False,
        ),
    ),
    # deepseek-ai/DeepSeek-V2-Lite (read from DeepSeek-V2-Lite-Chat's, the same architecture)
    "deepseek-v2-lite": (
        "deepseek_v2",
        dict(
            vocab_size=102400,
            hidden_size=2048,
            intermediate_size=10944,
            moe_intermediate_size=1408,
            num_hidden_layers=27,
            num_attention_heads=16,
            num_key_value_heads=16,
            q_lora_rank=None,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            n_routed_experts=64,
            num_experts_per_tok=6,
            n_shared_experts=2,
            first_k_dense_replace=1,
            scoring_func="softmax",
            topk_method="greedy",
            n_group=1,
            topk_group=1,
            norm_topk_prob=False,
            routed_scaling_factor=1.0,
            hidden_act="silu",
            max_position_embeddings=163840,
            rms_norm_eps=1e-6,
            rope_theta=10000,
            rope_scaling={
                "type": "yarn",
                "factor": 40,
                "original_max_position_embeddings": 4096,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 0.707,
                "mscale_all_dim": 0.707,
            },
            attention_bias=False,
            tie_word_embeddings=False,
        ),
    ),
    # deepseek-ai/DeepSeek-V3 (num_nextn_predict_layers 1 left out: the multi-token-prediction module is not
    # part of DeepseekV3ForCausalLM, nor of archlab's model)
    "deepseek-v3": (
        "deepseek_v3",
        dict(
            vocab_size=129280,
            hidden_size=7168,
            intermediate_size=18432,
            moe_intermediate_size=2048,
            num_hidden_layers=61,
            num_attention_heads=128,
            num_key_value_heads=128,
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            n_routed_experts=256,
            num_experts_per_tok=8,
            n_shared_experts=1,
            first_k_dense_replace=3,
            scoring_func="sigmoid",
            topk_method="noaux_tc",
            n_group=8,
            topk_group=4,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            hidden_act="silu",
            max_position_embeddings=163840,
            rms_norm_eps=1e-6,
            rope_theta=10000,
            rope_scaling={
                "type": "yarn",
                "factor": 40,
                "original_max_position_embeddings": 4096,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
            attention_bias=False,
            tie_word_embeddings=False,
        ),
    ),
}


# Step-3.5-Flash's config.json (stepfun-ai/Step-3.5-Flash, as vendored unchanged in yevvonlim/Megatron-Bridge,
# tests/unit_tests/models/step3p5/_reference/config.json at 2023060258425968ad5401c99153723cee8cd114): its
# per-layer lists run over the 45 layers and the 3 multi-token-prediction layers after them, which
# Step3p7TextConfig drops.
_STEP35_LISTS = 12  # the lists repeat a 4-layer cycle 12 times: 48 entries
STEP35 = dict(
    rope_scaling={
        "rope_type": "llama3",
        "factor": 2.0,
        "original_max_position_embeddings": 131072,
        "low_freq_factor": 1.0,
        "high_freq_factor": 32.0,
    },
    yarn_only_types=["full_attention"],
    hidden_size=4096,
    intermediate_size=11264,
    num_hidden_layers=45,
    max_seq_len=262144,
    vocab_size=128896,
    use_qk_norm=True,
    moe_layers_enum=",".join(str(i) for i in range(3, 45)),
    num_attention_heads=64,
    num_attention_groups=8,
    head_dim=128,
    use_moe=True,
    moe_num_experts=288,
    moe_top_k=8,
    moe_intermediate_size=1280,
    share_expert_dim=1280,
    moe_layer_offset=0,
    moe_every_n_layer=1,
    norm_expert_weight=True,
    moe_router_activation="sigmoid",
    moe_router_scaling_factor=3.0,
    att_impl_type="GQA",
    tie_word_embeddings=False,
    rope_theta=[5000000.0, 10000.0, 10000.0, 10000.0] * _STEP35_LISTS,
    use_head_wise_attn_gate=True,
    sliding_window=512,
    use_moe_router_bias=True,
    need_fp32_gate=True,
    sink=False,
    layer_types=["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"] * _STEP35_LISTS,
    use_rope_layers=[],
    num_nextn_predict_layers=3,
    partial_rotary_factors=[0.5, 1.0, 1.0, 1.0] * _STEP35_LISTS,
    attention_other_setting={
        "attention_type": "sliding_attention",
        "num_attention_heads": 96,
        "num_attention_groups": 8,
        "head_dim": 128,
        "true_head_dim": 128,
    },
    swiglu_limits=[0.0] * 43 + [7, 7, 0.0, 0.0, 0.0],
    swiglu_limits_shared=[0.0] * 44 + [16, 0.0, 0.0, 0.0],
    zero_centered=True,
    max_position_embeddings=262144,
)

# preset -> (transformers model class, its config class, the published config's keys, parameters the class
# leaves out: Step3p7TextModel is the text stack without its untied LM head, vocab_size x hidden_size)
QWEN3_NEXT = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=5120,
    num_hidden_layers=48,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=256,
    hidden_act="silu",
    max_position_embeddings=262144,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    attention_bias=False,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    decoder_sparse_step=1,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    num_experts_per_tok=10,
    num_experts=512,
    norm_topk_prob=True,
    router_aux_loss_coef=0.001,
    mlp_only_layers=[],
    layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 12,  # full_attention_interval 4
)

LAYOUT_CONFIGS = {
    # google/gemma-3-1b-pt
    "gemma3-1b": (
        "Gemma3ForCausalLM",
        "Gemma3TextConfig",
        dict(
            vocab_size=262144,
            hidden_size=1152,
            intermediate_size=6912,
            num_hidden_layers=26,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            hidden_activation="gelu_pytorch_tanh",
            max_position_embeddings=32768,
            query_pre_attn_scalar=256,
            rms_norm_eps=1e-6,
            sliding_window=512,
            sliding_window_pattern=6,
            rope_local_base_freq=10000.0,
            rope_theta=1000000.0,
            rope_scaling=None,
            attn_logit_softcapping=None,
            final_logit_softcapping=None,
        ),
        0,
    ),
    # google/gemma-3-27b-pt, text_config (the keys it leaves out take Gemma3TextConfig's defaults)
    "gemma3-27b": (
        "Gemma3ForCausalLM",
        "Gemma3TextConfig",
        dict(
            head_dim=128,
            hidden_size=5376,
            intermediate_size=21504,
            num_hidden_layers=62,
            num_attention_heads=32,
            num_key_value_heads=16,
            query_pre_attn_scalar=168,
            rope_scaling={"factor": 8.0, "rope_type": "linear"},
            sliding_window=1024,
        ),
        0,
    ),
    # SmolLM3Config()'s defaults (checkpoint HuggingFaceTB/SmolLM3-3B)
    "smollm3-3b": ("SmolLM3ForCausalLM", "SmolLM3Config", {}, 0),
    # stepfun-ai/Step-3.5-Flash (model_type step3p5, read by transformers' Step3p7TextConfig)
    "step-3.5-flash": ("Step3p7TextModel", "Step3p7TextConfig", STEP35, 128896 * 4096),
    # openai/gpt-oss-20b: GptOssConfig()'s defaults (the 120B's) but for its 24 layers and 32 experts
    "gpt-oss-20b": ("GptOssForCausalLM", "GptOssConfig", dict(num_hidden_layers=24, num_local_experts=32), 0),
    # openai/gpt-oss-120b: GptOssConfig()'s defaults
    "gpt-oss-120b": ("GptOssForCausalLM", "GptOssConfig", {}, 0),
    # Llama4TextConfig()'s defaults (checkpoint meta-llama/Llama-4-Scout-17B-16E), the text stack alone
    "llama4-scout-17b-16e": ("Llama4ForCausalLM", "Llama4TextConfig", {}, 0),
    # Qwen/Qwen3-Next-80B-A3B-Instruct's config.json (its multi-token-prediction layer, mtp.*, is not part of
    # Qwen3NextForCausalLM); transformers' Qwen3NextConfig() defaults hold the same sizes
    "qwen3-next-80b-a3b": ("Qwen3NextForCausalLM", "Qwen3NextConfig", QWEN3_NEXT, 0),
    # BambaConfig()'s defaults (every layer Mamba-2: attn_layer_indices null)
    "bamba-9b": ("BambaForCausalLM", "BambaConfig", {}, 0),
    # google-deepmind/recurrentgemma's Preset.RECURRENT_GEMMA_2B_V1 (recurrentgemma/common.py; its modules: one
    # key/value head, a gated MLP of mlp_expanded_width 7680, which RecurrentGemmaMlp's intermediate_size
    # halves) as RecurrentGemmaConfig keys; its other defaults are the preset's
    "recurrentgemma-2b": (
        "RecurrentGemmaForCausalLM",
        "RecurrentGemmaConfig",
        dict(intermediate_size=15360, num_key_value_heads=1),
        0,
    ),
    # JambaConfig()'s defaults (checkpoint ai21labs/Jamba-v0.1)
    "jamba-v0.1": ("JambaForCausalLM", "JambaConfig", {}, 0),
    # KimiLinearConfig()'s defaults (its docstring: moonshotai/Kimi-Linear-48B-A3B-Instruct)
    "kimi-linear-48b-a3b": ("KimiLinearForCausalLM", "KimiLinearConfig", {}, 0),
    # DeepseekV32Config()'s defaults (checkpoint deepseek-ai/DeepSeek-V3.2-Exp; no multi-token-prediction module)
    "deepseek-v3.2-exp": ("DeepseekV32ForCausalLM", "DeepseekV32Config", {}, 0),
    # Lfm3Config()'s defaults, whose docstring names LiquidAI/LFM3-1.7B
    "lfm3-1.7b": ("Lfm3ForCausalLM", "Lfm3Config", {}, 0),
    # BailingHybridConfig()'s defaults, whose docstring names inclusionAI/Ling-3.0-Flash (no MTP layer built)
    "ling-3.0-flash": ("BailingHybridForCausalLM", "BailingHybridConfig", {}, 0),
}

"""archlab-bench's context sweep (``contexts=[...]``): the growth fit on synthetic timings, the figures
and plot of a tiny sweep, its decoding states against hand-computed sizes, the memory cap's skips and
the settings it refuses. Nothing here asserts a speed."""

import math

import pytest
import torch

import archlab.bench.context
import archlab.build
from archlab.bench.context import VARIANTS, growth_exponents, predicted_peak, run_context_sweep
from archlab.build import compose
from archlab.errors import ConfigError

CONTEXTS = [16, 32, 64, 128]


@pytest.mark.parametrize("power", [0, 1, 2])
def test_growth_exponent_of_a_power_law_is_its_power(power):
    """t = 0.3·c^p gives exponent p, a ratio of 2^p per doubling, between every pair of neighbours too."""
    fit = growth_exponents(CONTEXTS, [0.3 * c**power for c in CONTEXTS], fit_from=16)
    assert fit["exponent"] == pytest.approx(power, abs=1e-12)
    assert fit["ratio_per_doubling"] == pytest.approx(2.0**power)
    assert [(n["from"], n["to"]) for n in fit["neighbours"]] == [(16, 32), (32, 64), (64, 128)]
    assert all(n["exponent"] == pytest.approx(power, abs=1e-12) for n in fit["neighbours"])


def test_growth_exponent_is_a_least_squares_fit_over_the_contexts_from_fit_from():
    """Only contexts >= fit_from enter the fit; by hand, log2 times (0, 1.5, 2) at log2 contexts (5, 6, 7)
    have slope ((-1)(-7/6) + 0 + (1)(5/6)) / 2 = 1; a skipped context (None) is left out everywhere."""
    times = [1000.0, 1.0, 2.0**1.5, 4.0]  # the first, below fit_from, would pull the slope far down
    fit = growth_exponents(CONTEXTS, times, fit_from=32)
    assert fit["exponent"] == pytest.approx(1.0) and fit["fitted_over"] == [32, 64, 128]
    assert [n["exponent"] for n in fit["neighbours"]] == pytest.approx([math.log2(1 / 1000), 1.5, 0.5])
    gap = growth_exponents(CONTEXTS, [1.0, None, 4.0, 8.0], fit_from=16)
    assert gap["exponent"] == pytest.approx(1.0) and gap["fitted_over"] == [16, 64, 128]
    assert [(n["from"], n["to"], n["exponent"]) for n in gap["neighbours"]] == [(16, 64, 1.0), (64, 128, 1.0)]
    assert growth_exponents(CONTEXTS, times, fit_from=128)["exponent"] is None  # one point: no fit


def test_predicted_peak_follows_the_last_two_contexts():
    assert predicted_peak([], 64) is None
    assert predicted_peak([(16, 100)], 64) == pytest.approx(400)  # one point: proportional
    assert predicted_peak([(16, 100), (32, 400)], 64) == pytest.approx(1600)  # slope 2
    assert predicted_peak([(16, 400), (32, 100)], 64) == pytest.approx(100)  # shrinking: held flat


TINY = [  # 4 layers so that the 3:1 hybrid holds an attention layer; heads of 16
    "model.n_layer=4",
    "model.d_model=32",
    "model.attention.n_head=2",
    "model.vocab_size=50",
    "contexts=[16,32]",
    "tokens_per_step=64",
    "warmup=0",
    "repeats=1",
    "decode_tokens=2",
    "fit_from=16",
    "threads=1",
]


def expected_state_bytes(variant: str, context: int, decode: int = 2) -> int | None:
    """By hand, float32, batch 1, heads of 16 (d_model 32 / 2 heads): an attention layer caches keys and
    values, 2·2·16 values per position, for context + decode positions; a Gated DeltaNet layer its
    convolution's last 3 inputs of 2·2·16 + 2·16 = 96 channels and 2 states of 16 × 16, 800 values; a KDA
    layer its convolution's last 3 inputs of 3·2·16 = 96 channels and the same states; a lightning layer its
    2 states of 16 × 16 alone."""
    attention, deltanet, lightning = 2 * 2 * 16 * (context + decode), 96 * 3 + 2 * 16 * 16, 2 * 16 * 16
    layers = {
        "attention": [attention] * 4,
        "gated_deltanet": [deltanet] * 4,
        "hybrid_3_1": [deltanet] * 3 + [attention],
        "kda": [deltanet] * 4,
        "lightning": [lightning] * 4,
    }
    return 4 * sum(layers[variant]) if variant in layers else None


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    plot = tmp_path_factory.mktemp("sweep") / "context_cost.png"
    return run_context_sweep(compose("bench", [*TINY, f"plot={plot}"])), plot


def test_the_sweep_measures_every_variant_at_every_context(sweep):
    out, plot = sweep
    names = ["attention", "gated_deltanet", "hybrid_3_1", "kda", "lightning", "mamba2", "mlstm", "rwkv4", "mamba"]
    names += ["rglru", "short_conv"]
    assert list(out["variants"]) == names and out["contexts"] == [16, 32] and out["tokens_per_step"] == 64
    assert [(r["variant"], r["context"]) for r in out["rows"]] == [(n, c) for n in names for c in (16, 32)]
    for row in out["rows"]:
        assert row["batch_size"] * row["context"] == 64 and "skipped" not in row
        assert row["step_s"] > 0 and row["tokens_per_s"] == pytest.approx(64 / row["step_s"])
        assert row["step_s_range"][0] <= row["step_s"] <= row["step_s_range"][1]
        assert row["peak_step_bytes"] > 0 and row["decode_s_per_token"] > 0
    for n in names:
        for measure in ("step_s", "peak_step_bytes", "decode_s_per_token", "state_bytes"):
            fit = out["fits"][n][measure]
            assert fit["fitted_over"] == [16, 32] and fit["exponent"] is not None
            assert fit["ratio_per_doubling"] == pytest.approx(2.0 ** fit["exponent"])
        assert set(out["targets"][n]) == {"step_ratio_per_doubling", "step_at_most_1.2x", "decoding_state_constant"}
    assert out["variants"]["gated_deltanet"]["selects"] == "model/attention=gated_deltanet"
    assert out["plot"] == str(plot) and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_decoding_state_is_constant_for_linear_mixers_and_grows_with_attention(sweep):
    """The cache's tensors hold exactly the hand-computed values: attention's KV cache grows linearly with
    the context, a Gated DeltaNet layer's convolution inputs and states do not (the hybrid's grows by its
    one attention layer's); the closed form agrees."""
    out, _ = sweep
    for row in out["rows"]:
        expected = expected_state_bytes(row["variant"], row["context"])
        if expected is not None:
            assert row["state_bytes"] == expected, row
        assert row["state_bytes"] == row["state_bytes_closed_form"], row
        assert row["state_storage_bytes"] >= row["state_bytes"]
    targets = out["targets"]
    assert targets["attention"]["decoding_state_constant"] is False
    assert targets["hybrid_3_1"]["decoding_state_constant"] is False
    linear = [n for n in out["variants"] if n not in ("attention", "hybrid_3_1")]
    assert "gated_deltanet" in linear and all(targets[n]["decoding_state_constant"] for n in linear)
    by = {(r["variant"], r["context"]): r["state_bytes"] for r in out["rows"]}
    per_layer = 4 * 2 * 2 * 16 * 16  # 16 more positions: keys and values of 2 heads of 16, float32
    assert by[("attention", 32)] - by[("attention", 16)] == 4 * per_layer
    assert by[("hybrid_3_1", 32)] - by[("hybrid_3_1", 16)] == per_layer


def test_a_context_over_the_memory_cap_is_skipped_with_a_note(monkeypatch):
    """Peaks of 1 then 2 MiB at contexts 16 and 32 predict 4 MiB at 64, over a 3 MiB cap: 64 is skipped,
    and 128 after it, each with a note; the rest is measured."""
    peaks = iter([2**20, 2 * 2**20])

    def fake_peak(fn, device):
        fn()
        return next(peaks)

    monkeypatch.setattr(archlab.bench.context, "peak_step_bytes", fake_peak)
    overrides = [*TINY, "contexts=[16,32,64,128]", "tokens_per_step=128", "variants=[attention]", "memory_cap_mib=3"]
    out = run_context_sweep(compose("bench", overrides))
    rows = {r["context"]: r for r in out["rows"]}
    assert "predicted peak 4 MiB > memory cap 3 MiB" in rows[64]["skipped"]
    assert rows[128]["skipped"].endswith("at context 64")
    assert "step_s" in rows[32] and "step_s" not in rows[64] and "decode_s_per_token" not in rows[128]
    assert out["fits"]["attention"]["step_s"]["fitted_over"] == [16, 32]


def test_every_variant_selects_what_it_names():
    """Each variant's option is a config the model group ships, or a registered mixer's kind; their mixers differ."""
    from archlab.bench.context import variant_config

    cfg = compose("bench", TINY)
    kinds = {}
    for name in VARIANTS:
        mcfg = variant_config(cfg.model, name, 64)
        assert mcfg.context_length == 64
        kinds[name] = mcfg.attention.kind
    assert kinds["attention"] == "causal" and kinds["gated_deltanet"] == "gated_deltanet"
    plain = ("mamba", "mlstm", "rwkv4", "rglru", "short_conv")
    assert [kinds[n] for n in plain] == list(plain)  # no YAML: the kind alone
    for name in ("kda", "lightning"):  # heads of the composed attention's size, 16
        a = variant_config(cfg.model, name, 64).attention
        assert (a.kind, a.n_head, a.head_dim) == (name, 2, 16)
    layers = variant_config(cfg.model, "hybrid_3_1", 64).layers
    assert list(layers.pattern) == ["deltanet", "deltanet", "deltanet", "attention"]
    assert set(VARIANTS) >= set(kinds)


@pytest.mark.parametrize(
    "override, field",
    [
        ("contexts=[32,16]", "contexts"),
        ("contexts=[]", "contexts"),
        ("contexts=[0,16]", "contexts"),
        ("tokens_per_step=48", "tokens_per_step"),
        ("variants=[attention,linear]", "variants"),
        ("variants=[attention,attention]", "variants"),
        ("decode_tokens=0", "decode_tokens"),
        ("fit_from=0", "fit_from"),
        ("memory_cap_mib=0", "memory_cap_mib"),
        ("plot=curves.svg", "plot"),
        ("compile=true", "compile"),
        ("precision=fp8", "precision"),
    ],
)
def test_bad_sweep_settings_are_refused_before_any_work(override, field, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("a model was built before the settings were checked")

    monkeypatch.setattr(archlab.build, "build_model", no_build)
    with pytest.raises(ConfigError) as err:
        run_context_sweep(compose("bench", [*TINY, override]))
    assert err.value.field == field


def test_the_cli_prints_the_sweep_as_tables(capsys):
    from archlab.cli.bench import _print_sweep

    fake = {  # two contexts, one skipped: every table and the note print
        "device": "cpu",
        "threads": 1,
        "precision": "32-true",
        "tokens_per_step": 64,
        "repeats": 1,
        "decode_tokens": 2,
        "fit_from": 16,
        "contexts": [16, 32],
        "variants": {"attention": {"selects": "the model as composed", "params": 12_345}},
        "rows": [
            {
                "variant": "attention",
                "context": 16,
                "step_s": 0.5,
                "peak_step_bytes": 2**21,
                "decode_s_per_token": 0.001,
                "state_bytes": 2**20,
                "state_bytes_closed_form": 2**20,
            },
            {"variant": "attention", "context": 32, "skipped": "out of memory at context 32"},
        ],
        "fits": {
            "attention": {
                m: growth_exponents([16, 32], [1.0, None], 16)
                for m in ("step_s", "peak_step_bytes", "decode_s_per_token", "state_bytes")
            }
        },
        "plot": None,
    }
    _print_sweep(fake)
    text = capsys.readouterr().out
    assert "0.500 / 2" in text and "1.00 / 1.000 (1.000)" in text
    assert "skipped attention at context 32: out of memory at context 32" in text


def test_bench_json_of_the_sweep_is_plain_json(sweep):
    import json

    out, _ = sweep
    assert json.loads(json.dumps(out)) == out
    assert torch.get_num_threads() == out["threads"]

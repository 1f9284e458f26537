"""The benchmark harness's arithmetic (not speed): rates, alternation, FLOP/s, ratios, memory."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import archlab.bench.harness
from archlab.bench.harness import (
    MOE_PARTS,
    attention_path,
    attention_paths,
    kernel_seconds,
    median_rate,
    moe_ranges,
    paired_ratio,
    part_seconds,
    peak_step_bytes,
    profile_call,
    run_bench,
    saved_activation_bytes,
    time_alternating,
)
from archlab.build import compose, compose_model
from archlab.config import to_model_config
from archlab.errors import ConfigError


@pytest.mark.parametrize(
    "overrides, precision, seq_len, expected",
    [
        ([], torch.bfloat16, 256, "bf16 matmuls and softmax"),
        (
            ["model.attention.window=64"],
            torch.bfloat16,
            256,
            "bf16 matmuls and softmax (nn/mixers/ops/cpu_attention.py) with a window mask",
        ),
        ([], torch.float32, 256, "SDPA"),
        ([], torch.bfloat16, 1024, "SDPA"),
        (["model/position=alibi"], torch.bfloat16, 256, "SDPA"),
        (["model.attention.softcap=50"], torch.bfloat16, 256, "explicit matmuls"),
        (
            ["model.attention.sinks=true"],
            torch.bfloat16,
            256,
            "bf16 matmuls and softmax (nn/mixers/ops/cpu_attention.py), a sink key first",
        ),
        (
            ["model.attention.sinks=true", "model.attention.window=64"],
            torch.float32,
            256,
            "SDPA with a window mask, a sink key",
        ),
        (
            ["model.attention.chunk=64", "model.attention.gate=head"],
            torch.float32,
            256,
            "SDPA with a chunk mask, a sigmoid head output gate",
        ),
        (
            ["model.attention.chunk=256"],
            torch.bfloat16,
            256,
            "bf16 matmuls and softmax (nn/mixers/ops/cpu_attention.py)",
        ),
    ],
)
def test_attention_path_names_what_the_step_runs(overrides, precision, seq_len, expected):
    mcfg = to_model_config(compose_model(["model=nano", "model.attention.dropout=0", *overrides]))
    assert attention_path(mcfg, torch.device("cpu"), precision, seq_len).startswith(expected)


def test_attention_path_per_layer_kind():
    layout = ["model/position=rope", "model/layers=irope", "model.layers.kinds.local.attention.window=32"]
    layout += ["+model.layers.kinds.global.attention.softcap=50"]
    mcfg = to_model_config(compose_model(["model=nano", "model.attention.dropout=0", *layout]))
    assert attention_paths(mcfg, torch.device("cpu"), torch.float32, 64) == (
        "local (layers 0,1,2): SDPA with a window mask; "
        "global (layer 3): explicit matmuls (soft-capped scores: SDPA cannot cap them)"
    )
    same = to_model_config(compose_model(["model=nano", "model/position=rope", "model/layers=nope_every_4th"]))
    assert attention_paths(same, torch.device("cpu"), torch.float32, 64) == "SDPA"


def test_median_rate_uses_the_median_call():
    assert median_rate([2.0, 1.0, 100.0], units_per_call=10) == 10 / 2.0


def test_paired_ratio_pairs_each_round():
    # per-round speed-ups theirs/ours: 2, 1, 3, 4, 1.5 -> sorted 1, 1.5, 2, 3, 4; inclusive quartiles 1.5, 2, 3
    ours, theirs = [1.0, 2.0, 1.0, 0.5, 2.0], [2.0, 2.0, 3.0, 2.0, 3.0]
    assert paired_ratio(ours, theirs) == pytest.approx((1.5, 2.0, 3.0))
    assert paired_ratio([2.0], [3.0]) == (1.5, 1.5, 1.5)


def test_paired_ratio_resists_drift_where_a_ratio_of_medians_does_not():
    # the machine slows from round to round (ours: 1, 2, 3 s); theirs is 1.1-1.2x slower in each round,
    # except one call that hit a burst: paired ratios 3, 1.2, 1.1 -> median 1.2
    ours, theirs = [1.0, 2.0, 3.0], [3.0, 2.4, 3.3]
    assert paired_ratio(ours, theirs)[1] == pytest.approx(1.2)
    assert median_rate(ours, 1) / median_rate(theirs, 1) == pytest.approx(1.5)  # the separate medians' ratio


def test_time_alternating_interleaves_and_counts_calls():
    """Warm-up rounds in order, then the timed rounds in order, reversed, in order: none runs first always."""
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    times = time_alternating(fns, warmup=2, repeats=3, device=torch.device("cpu"))
    assert calls == ["a", "b", "c"] * 2 + ["a", "b", "c"] + ["c", "b", "a"] + ["a", "b", "c"]
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3, "c": 3}


def test_time_alternating_files_each_time_under_its_own_function(monkeypatch):
    """A reversed round still files each call's seconds under its function, round i at index i: on a
    clock that only the calls move, a takes 1 s and b 2 s in every round."""
    now = [0.0]
    monkeypatch.setattr(archlab.bench.harness, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    def takes(seconds: float):
        def call() -> None:
            now[0] += seconds

        return call

    times = time_alternating({"a": takes(1.0), "b": takes(2.0)}, warmup=1, repeats=4, device=torch.device("cpu"))
    assert times == {"a": [1.0] * 4, "b": [2.0] * 4}


def test_saved_activation_bytes_counts_what_autograd_keeps():
    x = torch.randn(1000, requires_grad=True)
    with saved_activation_bytes() as saved:
        y = torch.exp(x)  # exp saves its output: 1000 float32
        y.sum().backward()
    assert saved[0] == 1000 * 4


def test_kernel_seconds_sorts_matmul_and_attention_kernels():
    cpu = torch.device("cpu")
    a = torch.randn(256, 256)
    q = torch.randn(1, 2, 64, 16)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # one fused kernel, no aten matmul inside
        attention = kernel_seconds(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True), cpu)
    matmul = kernel_seconds(lambda: torch.addmm(a[0], a, a), cpu)
    assert attention["attention"] > 0 and attention["matmul"] == 0
    assert matmul["matmul"] > 0 and matmul["attention"] == 0
    assert kernel_seconds(lambda: torch.exp(a), cpu) == {"matmul": 0.0, "attention": 0.0}


def test_part_seconds_follows_each_range_into_backward(monkeypatch):
    """A matmul in range A and an exp in range B, then backward: A's part holds the forward matmul and the
    two matmuls of its backward (one per operand), though backward runs outside either range."""
    from torch.profiler import record_function

    a = torch.randn(64, 64, requires_grad=True)

    def fn():
        with record_function("A"):
            h = a @ a
        with record_function("B"):
            y = h.exp()
        y.sum().backward()

    cpu = torch.device("cpu")
    events, _ = profile_call(fn, cpu)
    monkeypatch.setattr(archlab.bench.harness, "self_seconds", lambda event, device: float(event.name == "aten::mm"))
    assert part_seconds(events, cpu, {"A": "a", "B": "b"}) == {"a": 3.0, "b": 0.0}
    monkeypatch.setattr(archlab.bench.harness, "self_seconds", lambda event, device: float(event.name == "aten::exp"))
    assert part_seconds(events, cpu, {"A": "a", "B": "b"}) == {"a": 0.0, "b": 1.0}  # exp's backward reuses its output


def test_saved_activation_bytes_leaves_out_weights_and_their_views():
    linear = torch.nn.Linear(100, 50, bias=False)
    x = torch.randn(8, 100, requires_grad=True)
    with saved_activation_bytes(linear.parameters()) as saved:
        linear(x).sum().backward()  # the matmul saves x and weight.t(), a view of the weight
    assert saved[0] == 8 * 100 * 4


def test_peak_step_bytes_is_the_most_allocated_at_once():
    def step():
        a = torch.ones(250_000)  # 1 MB
        b = torch.ones(500_000)  # 2 MB: 3 MB live
        del a, b
        c = torch.ones(625_000)  # 2.5 MB, after both were freed
        return c.sum()

    assert peak_step_bytes(step, torch.device("cpu")) == 3_000_000


TINY_RUN = [  # a vocabulary, context and batch of a tiny bench, two timed rounds
    "model.vocab_size=50",
    "model.context_length=16",
    "batch_size=2",
    "warmup=1",
    "repeats=2",
    "matmul_size=64",
]
TINY_BENCH = ["model.n_layer=2", "model.d_model=32", "model.attention.n_head=2", *TINY_RUN]


@pytest.fixture(scope="module")
def result():
    pytest.importorskip("transformers")
    cfg = compose("bench", TINY_BENCH)
    return run_bench(cfg), cfg


def test_bf16_mixed_runs_both_sides_under_autocast_against_the_bf16_ceiling():
    """Both ceilings are measured; a bf16-mixed step is set against bf16's, and computes in bf16 (its
    loss differs from the float32 step's, which it would not if autocast were off)."""
    pytest.importorskip("transformers")
    out = run_bench(compose("bench", [*TINY_BENCH, "precision=bf16-mixed", "checkpointing=false"]))
    assert set(out["matmul_flops_by_dtype"]) == {"float32", "bfloat16"}
    assert out["compute_dtype"] == "bfloat16" and out["matmul_flops"] == out["matmul_flops_by_dtype"]["bfloat16"]
    for name in ("archlab", "hf"):
        row = out["train"][name]
        assert row["fraction_of_matmul"] == pytest.approx(row["flops"] / out["matmul_flops_by_dtype"]["bfloat16"])


def test_bench_step_autocast_computes_in_bf16():
    from archlab.bench.harness import StepFns

    seen = []
    step = StepFns(lambda t: seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
                   or torch.zeros(*t.shape, 5, requires_grad=True), torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), True)  # fmt: skip
    step.step(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))
    assert seen == [torch.bfloat16]


def test_bench_figures_are_consistent(result):
    out, cfg = result
    from archlab.accounting import count

    assert out["seq_len"] == 16
    assert out["generate_tokens"] == 16 - 8  # null fills the context after the 8-token prompt
    assert out["compiled"] is False
    # 6N + 12·L·H·Q·T with N from the closed form, T = 16
    model_cfg = to_model_config(cfg.model)
    assert out["flops_per_token"] == 6 * count(model_cfg)["non_embedding"] + 12 * 2 * 2 * 16 * 16
    for name in ("archlab", "hf"):
        row = out["train"][name]
        assert row["tokens_per_s"] == pytest.approx(2 * 16 / row["step_s"])
        assert row["flops"] == pytest.approx(out["flops_per_token"] * row["tokens_per_s"])
        assert row["fraction_of_matmul"] == pytest.approx(row["flops"] / out["matmul_flops"])
        # the floor: the step's matmul and attention kernel time alone
        assert row["matmul_s"] > 0 and row["attention_s"] > 0
        assert row["floor_s"] == pytest.approx(row["matmul_s"] + row["attention_s"])
        assert "moe_split_s" not in row  # a dense layout has no MoE split
        assert row["floor_fraction_of_matmul"] == pytest.approx(
            out["flops_per_token"] * 2 * 16 / row["floor_s"] / out["profiled_matmul_flops"]
        )
    for section in ("train", "generate"):
        q1, q3 = out[section]["ratio_quartiles"]  # of the per-round ratios, whose median is the ratio
        assert 0 < q1 <= out[section]["ratio"] <= q3


TINY_MOE = [
    "model=mixtral-8x7b",
    "model.n_layer=2",
    "model.d_model=32",
    "model.attention.n_head=4",
    "model.attention.n_kv_head=2",
    "model.mlp.routing.n_experts=4",
    "model.mlp.expert_d_ff=32",
    *TINY_RUN,
    "checkpointing=false",
]


def test_moe_split_parts_sum_to_the_step():
    """A moe layout's step split into router, permutation, expert MLPs and the rest: every part present
    and non-negative, the three MoE parts above zero (each runs ops, forward and backward), the parts and
    "other" summing to the timed median step (to rounding: 1e-9 relative) and the shares to 1."""
    pytest.importorskip("transformers")
    out = run_bench(compose("bench", TINY_MOE))
    row = out["train"]["archlab"]
    assert set(row["moe_split_s"]) == set(row["moe_split_fraction"]) == {*MOE_PARTS, "other"}
    assert all(v >= 0 for v in (*row["moe_split_s"].values(), *row["moe_split_fraction"].values()))
    assert all(row["moe_split_s"][part] > 0 for part in MOE_PARTS)
    assert sum(row["moe_split_s"].values()) == pytest.approx(row["step_s"], rel=1e-9)
    assert sum(row["moe_split_fraction"].values()) == pytest.approx(1.0, rel=1e-9)
    assert row["profiled_step_s"] > 0 and "moe_split_s" not in out["train"]["hf"]


def test_moe_ranges_label_every_stage_and_leave_no_trace():
    from archlab.build import build_model, compose_model
    from archlab.nn.moe import MoE

    model = build_model(compose_model([*TINY_MOE[:9], "model.mlp.n_shared_experts=1"]))
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    with moe_ranges(model) as ranges:
        assert sorted(ranges.values()) == sorted(MOE_PARTS)
        assert all("route" in m.__dict__ and "forward" in m.shared.__dict__ for m in moes)
    for m in moes:  # the instances run their class's methods again
        assert not {"route", "auxiliary", "dispatch", "combine"} & set(m.__dict__)
        assert "forward" not in m.experts.__dict__ and "forward" not in m.shared.__dict__
    with moe_ranges(build_model(compose_model(TINY_MOE[1:9]))) as ranges:  # a dense layout: nothing to split
        assert ranges == {}


def test_checkpointing_saves_activation_memory(result):
    out, _ = result
    memory = out["memory"]
    assert 0 < memory["checkpointing"]["saved_activation_bytes"] < memory["plain"]["saved_activation_bytes"]
    assert 0 < memory["checkpointing"]["peak_step_bytes"] < memory["plain"]["peak_step_bytes"]
    # what backward keeps is alive at once when backward starts: the peak holds at least that
    assert memory["plain"]["peak_step_bytes"] >= memory["plain"]["saved_activation_bytes"]


@pytest.mark.parametrize(
    "override, field, allowed",
    [
        ("generate_tokens=9", "generate_tokens", "= 8"),
        ("seq_len=17", "seq_len", "null or 1 to model.context_length=16"),
        ("seq_len=-4", "seq_len", "null or 1 to"),
        ("threads=-1", "threads", "null or a positive integer"),
        ("warmup=-3", "warmup", "an integer >= 0"),
        ("format=xml", "format", "one of ['json', 'table']"),
        ("precision=16-mixed", "precision", "one of ['32-true', 'bf16-mixed', 'bf16-true']"),
        ("device=tpu", "device", "auto, cpu, cuda or cuda:<index>"),
        ("device=cuda:x", "device", "auto, cpu, cuda or cuda:<index>"),
        pytest.param(
            "device=cuda",
            "device",
            "this machine has no CUDA GPU",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present"),
        ),
    ],
)
def test_bad_settings_are_refused_before_any_work(override, field, allowed, monkeypatch):
    import archlab.build

    def no_build(*args, **kwargs):
        raise AssertionError("a model was built before the settings were checked")

    monkeypatch.setattr(archlab.build, "build_model", no_build)
    cfg = compose("bench", ["model.context_length=16", override])
    with pytest.raises(ConfigError) as err:
        run_bench(cfg)
    assert err.value.field == field and allowed in err.value.allowed


@pytest.mark.slow
def test_compiled_bench_runs_and_compiled_model_matches_eager():
    """torch.compile traces the hand-written autograd functions (RMSNorm, RoPE, SwiGLU) of a LLaMA layout."""
    pytest.importorskip("transformers")
    tiny = [
        "model=llama2-7b",
        "model.n_layer=1",
        "model.d_model=32",
        "model.attention.n_head=4",
        "model.attention.n_kv_head=2",
        "model.vocab_size=50",
        "model.context_length=16",
        "model.mlp.multiple_of=8",
    ]
    out = run_bench(
        compose(
            "bench",
            tiny + ["batch_size=2", "warmup=1", "repeats=1", "matmul_size=64", "checkpointing=false", "compile=true"],
        )
    )
    assert out["compiled"] is True and out["train"]["archlab"]["tokens_per_s"] > 0

    from archlab.build import build_model, compose_model

    torch.manual_seed(0)
    model = build_model(compose_model(tiny), dtype=torch.float64)
    idx = torch.randint(0, 50, (2, 16))
    eager = model(idx)
    eager_grads = torch.autograd.grad(eager.square().sum(), list(model.parameters()))
    compiled = torch.compile(model)(idx)
    grads = torch.autograd.grad(compiled.square().sum(), list(model.parameters()))
    torch.testing.assert_close(compiled, eager)
    for g, ref in zip(grads, eager_grads):
        torch.testing.assert_close(g, ref)


def test_multi_token_prediction_modules_are_left_out_of_the_steps_flops():
    """The timed step is the next-token one (transformers' model has no modules to run): a model's MTP
    modules are built, not run, and its FLOPs per token are those of the same model without them."""
    from archlab.accounting import count

    cfg = compose("bench", [*TINY_BENCH, "model.head.mtp.depth=1", "compare_hf=false"])
    out = run_bench(cfg)
    model_cfg = to_model_config(cfg.model)
    assert count(model_cfg)["mtp"] > 0
    assert out["flops_per_token"] == 6 * count(model_cfg)["non_embedding"] + 12 * 2 * 2 * 16 * 16

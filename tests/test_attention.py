"""Effect tests of the causal attention (archlab/nn/mixers/attention.py): the scores' scale and soft-capping
and the QK-norm against the attention written out here; sliding windows (what a layer sees, what it caches,
its FLOPs and KV-cache bytes); and the parts of the 2025 open models (issue 26): sinks (gpt-oss), an output
gate per dim or per head (AFMoE, Qwen3-Next; Step-3.5), its sigmoid or softplus (Laguna), chunked local attention, the weightless l2 QK-norm
and the position-dependent query scale (Llama 4; Ministral 3, by each row's positions). Each part is
compared with the attention written out here with an explicit softmax, counted in closed form, decoded with
the KV cache past a chunk, refused by every Hugging Face family, and trained a few steps. What the
attention does to q and k otherwise (the QK-norm's order, scale and shift, clip_qkv):
tests/test_attention_qk.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import parts
from helpers.hf import families_holding, max_diff, randomize
from helpers.parts import EVERY_OTHER_GLOBAL, F64, build, plain, reference_attention, short_fit, tiny, tokens

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.nn.mixers.ops import cpu_attention
from archlab.nn.validation import ignored, validate

pytestmark = pytest.mark.usefixtures("single_thread")


def query_scale(p, beta, every, offset):
    """Llama 4's temperature ``1 + attn_scale·log1p(⌊(p + 1) / floor_scale⌋)`` (offset 1) and Ministral 3's
    ``1 + β·log(1 + ⌊p / original_max_position_embeddings⌋)`` (offset 0), one position at a time."""
    return 1 + beta * math.log(1 + math.floor((p + offset) / every))


def reference(attn, x, cfg, visible=None):
    """The attention sublayer from its weights: project, l2-norm q and k (no weight), scale the queries by
    position, softmax with each head's sink in the denominator, gate by sigmoid(x·Wᵀ + b) (or its softplus),
    project back."""
    a, eps = cfg.attention, cfg.norm.eps
    B, T, _ = x.shape
    H, KV, hd = attn.n_head, attn.n_kv_head, attn.head_dim
    qkv = x @ attn.qkv.weight.T + (attn.qkv.bias if attn.qkv.bias is not None else 0)
    q, k, v = (t.view(B, T, -1, hd).transpose(1, 2) for t in qkv.split((H * hd, KV * hd, KV * hd), dim=-1))
    if a.qk_norm == "l2":
        q = q / torch.sqrt(q.pow(2).mean(-1, keepdim=True) + eps)
        k = k / torch.sqrt(k.pow(2).mean(-1, keepdim=True) + eps)
    if a.query_scale_beta is not None:
        scales = [query_scale(p, a.query_scale_beta, a.query_scale_length, a.query_scale_offset) for p in range(T)]
        q = q * torch.tensor(scales, dtype=F64)[:, None]
    k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
    s = q @ k.transpose(-2, -1) / math.sqrt(hd)
    if a.softcap is not None:
        s = a.softcap * torch.tanh(s / a.softcap)
    visible = torch.ones(T, T, dtype=torch.bool).tril() if visible is None else visible
    e = torch.exp(s).masked_fill(~visible, 0.0)
    denominator = e.sum(-1, keepdim=True)
    if a.sinks:
        denominator = denominator + torch.exp(attn.sinks).view(1, H, 1, 1)
    y = ((e / denominator) @ v).transpose(1, 2)  # [B, T, H, hd]
    if a.gate != "none":
        g = x @ attn.gate.weight.T + (attn.gate.bias if attn.gate.bias is not None else 0)
        g = F.softplus(g) if a.gate_activation == "softplus" else torch.sigmoid(g)
        y = y * g.view(B, T, H, -1)
    return y.reshape(B, T, H * hd) @ attn.proj.weight.T + attn.proj.bias


PARTS = {
    "sinks": {"sinks": True},
    "sinks-softcap-mqa": {"sinks": True, "softcap": 2.0, "n_kv_head": 1},
    "gate-elementwise-bias": {"gate": "elementwise", "qkv_bias": True},
    "gate-head": {"gate": "head", "qkv_bias": False},
    "gate-head-softplus": {"gate": "head", "gate_activation": "softplus", "qkv_bias": False},
    "gate-elementwise-softplus": {"gate": "elementwise", "gate_activation": "softplus"},
    "l2-qk-norm": {"qk_norm": "l2"},
    "query-scale-llama4": {"query_scale_beta": 0.7, "query_scale_length": 2, "query_scale_offset": 1},
    "query-scale-ministral3": {"query_scale_beta": 0.4, "query_scale_length": 3},
    "all": {"sinks": True, "gate": "head", "qk_norm": "l2", "query_scale_beta": 0.5, "query_scale_length": 4},
}


@pytest.mark.parametrize("settings", PARTS.values(), ids=PARTS.keys())
def test_attention_part_equals_its_formula(settings):
    cfg = tiny(attention=settings)
    attn = build(cfg).blocks[0].attn
    x = torch.randn(2, 9, 32, dtype=F64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(attn(x), reference(attn, x, cfg))


@pytest.mark.parametrize(
    "settings",
    [{"sinks": True}, {"sinks": True, "window": 4, "n_kv_head": 2}, {"sinks": True, "gate": "head", "chunk": 3}],
    ids=["sinks", "sinks-window-gqa", "sinks-gate-chunk"],
)
def test_sink_gradients_equal_the_formulas(settings):
    """The sink rides in one more head dimension of an extra key (``sink_key``): every weight's gradient,
    the sinks' included, equals that of the formula's explicit softmax."""
    cfg = tiny(attention=settings)
    attn = build(cfg).blocks[0].attn
    x = torch.randn(2, 9, 32, dtype=F64, generator=torch.Generator().manual_seed(2))
    i = torch.arange(9)
    visible = i[:, None] >= i[None, :]
    if settings.get("window"):
        visible &= i[:, None] - i[None, :] < settings["window"]
    if settings.get("chunk"):
        visible &= i[:, None] // settings["chunk"] == i[None, :] // settings["chunk"]
    weights = torch.randn(2, 9, 32, dtype=F64)
    mask = visible if settings.keys() & {"window", "chunk"} else None  # None: causal, sink_key's first query
    got = torch.autograd.grad((attn(x, mask=mask) * weights).sum(), list(attn.parameters()))
    expected = torch.autograd.grad((reference(attn, x, cfg, visible) * weights).sum(), list(attn.parameters()))
    for (name, _), g, e in zip(attn.named_parameters(), got, expected):
        torch.testing.assert_close(g, e, msg=name)


def test_sinks_in_bf16_on_the_cpu_path_match_float64(monkeypatch):
    """bf16 training on the CPU runs the sink key through the matmul path (``nn/mixers/ops/cpu_attention.py``):
    outputs and the sinks' gradient agree with float64 to bf16's precision."""
    cfg = tiny(attention={"sinks": True, "window": 5})
    attn = build(cfg).blocks[0].attn
    x = torch.randn(2, 12, 32, dtype=F64, generator=torch.Generator().manual_seed(3))
    i = torch.arange(12)
    window = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < 5)
    y = attn(x, mask=window)
    (sinks,) = torch.autograd.grad(y.square().sum(), [attn.sinks])
    low = attn.to(torch.bfloat16)
    calls = []
    matmul_attention = cpu_attention.matmul_attention
    monkeypatch.setattr(cpu_attention, "matmul_attention", lambda *a: calls.append(1) or matmul_attention(*a))
    y16 = low(x.to(torch.bfloat16), mask=window)
    assert calls, "the bf16 CPU path did not run"
    (sinks16,) = torch.autograd.grad(y16.float().square().sum(), [low.sinks])
    assert (y16.double() - y).norm() / y.norm() < 2e-2
    assert (sinks16.double() - sinks).norm() / sinks.norm() < 5e-2


def test_chunk_sees_exactly_its_chunk():
    """A chunked layer's output at t reads the positions of t's chunk up to t (⌊i/C⌋ = ⌊j/C⌋), with a sink
    and a gate beside it; the model's logits at t, one layer and no positions, equal those of t's chunk
    run alone."""
    cfg = tiny(n_layer=1, attention={"chunk": 4, "sinks": True, "gate": "elementwise"})
    model, idx = build(cfg), tokens(cfg, 11)
    i = torch.arange(11)
    visible = (i[:, None] >= i[None, :]) & (i[:, None] // 4 == i[None, :] // 4)
    captured = {}
    model.blocks[0].attn.register_forward_hook(lambda m, args, out: captured.update(x=args[0], y=out))
    with torch.no_grad():
        full = model(idx)
        torch.testing.assert_close(captured["y"], reference(model.blocks[0].attn, captured["x"], cfg, visible))
        for t in range(11):
            start = t // 4 * 4
            torch.testing.assert_close(full[:, t], model(idx[:, start : t + 1])[:, -1])


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_cached_decoding_past_chunks_equals_the_full_forward(position):
    """Every part at once, decoded with the KV cache: a prefill that ends mid-chunk, then one token at a
    time across two chunk boundaries, then a step of several tokens; a chunked layer keeps chunk - 1
    positions, enough for any row's chunk (a left-padded row's chunks start elsewhere)."""
    attention = {"chunk": 5, "sinks": True, "gate": "head", "qk_norm": "l2", "query_scale_beta": 0.3,
                 "query_scale_length": 3}  # fmt: skip
    cfg = tiny(position={"kind": position}, attention=attention)
    model, idx = build(cfg), tokens(cfg, 20)
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 20)
        steps = [model(idx[:, :7], cache)] + [model(idx[:, t : t + 1], cache) for t in range(7, 16)]
        steps.append(model(idx[:, 16:], cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-10)
    assert cache.k[0].shape[2] == cache.k[1].shape[2] == 4


def test_a_padded_batch_is_chunked_as_each_prompt_alone():
    """Left padding: each row's chunks start at its first token (as Hugging Face's chunked mask), so the
    batch's logits at real tokens and its greedy continuation equal each prompt's alone."""
    from archlab.generate import generate

    cfg = tiny(position={"kind": "rope"}, attention={"chunk": 3, "sinks": True, "gate": "elementwise"})
    model = build(cfg)
    prompts = [[5, 9, 2, 7, 1, 3, 8], [4, 4], [11, 3, 6, 2]]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        batch = model(ids, attention_mask=mask)
        for row, prompt in enumerate(prompts):
            torch.testing.assert_close(batch[row, -len(prompt) :], model(torch.tensor([prompt]))[0])
    together = generate(model, ids, max_new_tokens=8, attention_mask=mask)
    for row, prompt in enumerate(prompts):
        alone = generate(model, torch.tensor([prompt]), max_new_tokens=8)
        assert together[row, width:].tolist() == alone[0, len(prompt) :].tolist()


def test_query_scale_is_llama4s_and_ministral3s():
    """``query_scales`` against the two published forms, past several steps of the floor."""
    from archlab.nn.mixers.attention import query_scales

    for beta, every, offset in ((0.1, 4, 1), (0.25, 3, 0)):
        got = query_scales(0, 30, beta, every, offset, torch.device("cpu")).flatten()
        expected = [query_scale(p, beta, every, offset) for p in range(30)]
        torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32))
    assert query_scales(7, 1, 0.1, 8, 1, torch.device("cpu")).item() == pytest.approx(1 + 0.1 * math.log(2))


@pytest.mark.parametrize(
    "settings, params",
    [
        ({"gate": "elementwise", "qkv_bias": True}, (32 + 1) * 4 * 8),
        ({"gate": "head", "qkv_bias": False}, 32 * 4),
        ({"sinks": True}, 4),
        ({"qk_norm": "l2", "query_scale_beta": 0.1, "chunk": 3}, 0),
    ],
    ids=["gate-elementwise-bias", "gate-head", "sinks", "weightless"],
)
def test_closed_form_counts(settings, params):
    """Per layer: a gate d·g (+ g biases with qkv_bias; g = H·hd elementwise, H per head), H sinks; the
    l2 norm, the query scale and chunks have no weights. 2 layers, d 32, H 4, hd 8."""
    plain = count_params(tiny(attention={"qkv_bias": settings.get("qkv_bias", True)}))
    counted = count_params(tiny(attention=settings))
    assert counted["attention"] - plain["attention"] == 2 * params
    assert counted["total"] - plain["total"] == 2 * params


def test_chunks_cut_attention_flops_and_the_kv_cache():
    """12·H·hd per key a query sees, at most the chunk; 2·KV·hd values cached per position, at most the
    chunk (float32: 4 bytes each; 2 layers chunked by 6, T = 24)."""
    from archlab.accounting import kv_cache_bytes

    chunked = tiny(attention={"chunk": 6})
    full = count_params(tiny())["flops_per_token"]
    assert full - count_params(chunked)["flops_per_token"] == 2 * 12 * 4 * 8 * (24 - 6)
    assert kv_cache_bytes(chunked, 24) == 4 * 2 * 2 * 8 * (6 + 6)
    assert kv_cache_bytes(chunked, 4) == 4 * 2 * 2 * 8 * (4 + 4)


@pytest.mark.parametrize(
    ("field", "value", "holders"),
    [
        ("chunk", 8, {"llama4_text"}),
        ("sinks", True, {"gpt_oss", "flint", "granite_swa", "granitemoe_swa"}),
        ("gate", "head", {"step3p5", "lfm3", "laguna"}),  # per head: Step-3.5's g_proj, LFM3's, Laguna's (softplus)
        # Llama 4 scales the queries of its NoPE layers only; Ministral 3 every layer's, by RoPE's positions; Beam
        # its NoPE layers' (a beta of 0.1, its form and positions named as other fields)
        ("query_scale_beta", 0.1, {"ministral3", "beam"}),
        ("qk_norm", "l2", {"llama4_text", "nanochat"}),
    ],
)
def test_only_the_hugging_face_families_with_a_part_hold_it(field, value, holders):
    """Every other family of its mixer names the field it cannot hold."""
    cfg = tiny(position={"kind": "rope"}, attention={field: value})
    assert families_holding(cfg, {f"model.attention.{field}"}) == holders


def test_only_laguna_holds_a_softplus_gate():
    """Every other family of its mixer, those with a sigmoid gate among them, names gate_activation."""
    cfg = tiny(position={"kind": "rope"}, attention={"gate": "head", "gate_activation": "softplus"})
    assert families_holding(cfg, {"model.attention.gate_activation"}) == {"laguna"}


def test_the_gate_activation_is_read_with_a_gate_alone():
    """Without a gate, a softplus gate_activation is reported as ignored; with one it is read."""
    assert [i.field for i in ignored(tiny(attention={"gate_activation": "softplus"}))] == [
        "model.attention.gate_activation"
    ]
    assert ignored(tiny(attention={"gate": "head", "gate_activation": "softplus"})) == []


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.attention.chunk=0"], "model.attention.chunk"),
        (["model.attention.gate=head", "model.attention.gate_activation=tanh"], "model.attention.gate_activation"),
        (["model.attention.chunk=8", "model.attention.window=4"], "model.attention.chunk"),
        (["model.attention.gate=sigmoid"], "model.attention.gate"),
        (["model.attention.qk_norm=l1"], "model.attention.qk_norm"),
        (["model.attention.query_scale_beta=0"], "model.attention.query_scale_beta"),
        (
            ["model.attention.query_scale_beta=0.1", "model.attention.query_scale_length=0"],
            "model.attention.query_scale_length",
        ),
        (
            ["model.attention.query_scale_beta=0.1", "model.attention.query_scale_offset=-1"],
            "model.attention.query_scale_offset",
        ),
        (["model.attention.window=0"], "model.attention.window"),
        (["model/layers=every_other_global", "model.layers.pattern=[local,globl]"], "model.layers.pattern"),
        (["model.attention.softcap=-1"], "model.attention.softcap"),
        (["model.attention.scale=0"], "model.attention.scale"),
        (["model.attention.qk_norm=layer"], "model.attention.qk_norm"),
    ],
)
def test_bad_settings_name_their_field(overrides, field):
    with pytest.raises(ConfigError) as info:
        compose_model(["model=nano", *overrides])
    assert info.value.field == field


def test_query_scale_fields_unread_without_beta():
    """The scale's length and offset set without its beta are reported as ignored."""
    from archlab.nn.validation import ignored

    cfg = compose_model(["model=nano", "model.attention.query_scale_length=16", "model.attention.query_scale_offset=1"])
    assert {"model.attention.query_scale_length", "model.attention.query_scale_offset"} <= {
        i.field for i in ignored(cfg)
    }


def test_each_part_trains():
    """A few AdamW steps on one repeated batch lower the loss, with every part's parameters reached."""
    parts = [
        ["model.attention.sinks=true"],
        ["model.attention.gate=elementwise"],
        ["model.attention.gate=head"],
        ["model.attention.chunk=4", "model/position=rope"],
        ["model.attention.qk_norm=l2", "model/position=rope"],
        ["model.attention.query_scale_beta=0.5", "model.attention.query_scale_length=4", "model/position=none"],
    ]
    for overrides in parts:
        cfg = compose_model(
            ["model=nano", "model.n_layer=1", "model.d_model=32", "model.context_length=16", *overrides]
        )
        torch.manual_seed(0)
        model = build_model(cfg)
        losses = short_fit(model, cfg.vocab_size, 16)
        assert all(p.grad is not None for p in model.parameters()), overrides
        assert losses[-1] < 0.9 * losses[0], overrides


def test_query_scale_by_position_reads_each_row_s_rope_positions():
    """With ``query_scale_by: position`` a left-padded row's logits are those it has alone (its positions
    count from its first token, as RoPE's do); by index (Llama 4) the padding shifts the query scale."""
    rope = dict(kind="rope")
    cfg = tiny(vocab_size=96, position=rope, attention=dict(query_scale_beta=0.5, query_scale_length=2))
    by_position = validate(tiny(vocab_size=96, position=rope, attention=dict(
        query_scale_beta=0.5, query_scale_length=2, query_scale_by="position")))  # fmt: skip
    ids = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(3))
    padded, mask = torch.cat((torch.zeros(1, 3, dtype=torch.long), ids), 1), torch.tensor([[0] * 3 + [1] * 6])
    for c, alike in ((by_position, True), (validate(cfg), False)):
        model = randomize(build_model(c), seed=5)
        with torch.no_grad():
            alone, in_batch = model(ids), model(padded, attention_mask=mask)[:, 3:]
        assert (max_diff(alone, in_batch) <= 1e-5) == alike


# ---- the scores' scale and soft-capping, the QK-norm, and sliding windows


@pytest.mark.parametrize(
    "settings",
    [
        {"qk_norm": "head"},
        {"qk_norm": "full", "n_kv_head": 2},
        {"scale": 0.05},
        {"softcap": 2.0, "n_kv_head": 1},
        {"softcap": 2.0, "scale": 0.3, "qk_norm": "head"},
    ],
    ids=["qk-norm-head", "qk-norm-full-gqa", "scale", "softcap-mqa", "softcap-scale-qknorm"],
)
def test_attention_equals_its_formula(settings):
    cfg = plain(attention=settings)
    attn = build(cfg).blocks[0].attn
    x = torch.randn(2, 7, 32, dtype=F64)
    with torch.no_grad():
        expected = reference_attention(attn, x, cfg.norm.eps, settings.get("qk_norm", "none"),
                                       settings.get("softcap"), settings.get("scale"))  # fmt: skip
        torch.testing.assert_close(attn(x), expected)


@pytest.mark.parametrize("window, alternating", [(3, False), (4, True)])
def test_sliding_window_sees_exactly_the_window(window, alternating):
    """A local layer's output at t depends only on positions t-window+1..t; a global one on all of them.
    Checked through the attention sublayer written out with that visibility."""
    layers = EVERY_OTHER_GLOBAL if alternating else {}
    cfg = plain(attention={"window": window, "n_kv_head": 2}, layers=layers)
    model = build(cfg)
    x = torch.randn(2, 9, 32, dtype=F64)
    pos = torch.arange(9)
    distance = pos[:, None] - pos[None, :]
    for layer, block in enumerate(model.blocks):
        local = not alternating or layer % 2 == 0
        visible = (distance >= 0) & (distance < window) if local else distance >= 0
        assert block.attn.window == (window if local else None)
        with torch.no_grad():
            expected = reference_attention(block.attn, x, cfg.norm.eps, visible=visible)
            masks = model.mask(model.position, 0, 9, 0, block.attn.window, F64, x.device)
            torch.testing.assert_close(block.attn(x, None, masks), expected)


def test_sliding_window_model_output_depends_only_on_the_window():
    """One layer, relative positions (RoPE): the logits at t equal those of the window alone."""
    cfg = plain(n_layer=1, position={"kind": "rope"}, attention={"window": 4})
    model, idx = build(cfg), tokens(cfg, T=12)
    with torch.no_grad():
        full = model(idx)
        for t in range(3, 12):
            torch.testing.assert_close(full[:, t], model(idx[:, t - 3 : t + 1])[:, -1])


def test_a_window_layer_caches_only_its_window():
    cfg = plain(attention={"window": 3}, layers=EVERY_OTHER_GLOBAL)
    model = build(cfg)
    cache = model.new_cache(2, 16)
    with torch.no_grad():
        model(tokens(cfg, T=10), cache)
        model(tokens(cfg, T=1), cache)
    assert cache.k[0].shape[2] == 2 and cache.k[1].shape[2] == 16  # layer 0 local (window - 1 kept), 1 global


def test_windows_cut_attention_flops():
    """12·H·hd per key a query sees: T keys in a global layer, the window in a local one."""
    T, H, hd = 16, 4, 8
    full = count_params(plain(n_layer=2))["flops_per_token"]
    windowed = count_params(plain(n_layer=2, attention={"window": 4}, layers=EVERY_OTHER_GLOBAL))["flops_per_token"]
    assert full - windowed == 12 * H * hd * (T - 4)


def test_kv_cache_bytes_count_only_the_window_of_a_local_layer():
    """2·KV·hd values per position kept, per layer; a local layer keeps at most its window. Checked
    against the cache a full-context prefill actually allocates (global) or keeps (local, window - 1)."""
    from archlab.accounting import kv_cache_bytes

    cfg = plain(attention={"n_kv_head": 2, "window": 4}, layers=EVERY_OTHER_GLOBAL)  # layer 0 local, layer 1 global
    assert kv_cache_bytes(cfg, 16) == 4 * 2 * 2 * 8 * (4 + 16)
    assert kv_cache_bytes(plain(attention={"n_kv_head": 2}), 16) == 4 * 2 * 2 * 8 * (16 + 16)
    model = build(cfg)
    cache = model.new_cache(1, 16)
    with torch.no_grad():
        model(tokens(cfg, T=16, B=1), cache)
    held = sum(t.numel() for t in (*cache.k, *cache.v))
    assert held == 2 * 2 * 8 * (3 + 16)  # the window layer keeps window - 1 for the next query, plus its own


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.attention.softcap=5.0", "model.head.softcap=10.0"],
        ["model.attention.window=8", "model/layers=every_other_global", "model/position=rope"],
    ],
    ids=["softcaps", "window"],
)
def test_softcaps_and_windows_train(overrides):
    """A few AdamW steps on one repeated batch lower the loss: gradients reach every part."""
    parts.check_trains(overrides, n_layer=2, length=32, steps=25)

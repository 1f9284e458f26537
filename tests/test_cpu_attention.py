"""bf16 attention on the CPU as matmuls (archlab/nn/mixers/ops/cpu_attention.py): values and all three gradients
against float64 SDPA on the same bf16-rounded inputs, no further from it than SDPA's own bf16 kernel
(times a small factor); the model takes this path under bf16 autocast and only there."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from archlab import build_model, compose_model
from archlab.nn.mixers.ops import cpu_attention
from archlab.nn.mixers.ops.cpu_attention import matmul_attention

BF16, F64 = torch.bfloat16, torch.float64


def errors(fn, q, k, v, grad, mask, reference):
    """Largest |difference| from ``reference`` (out, dq, dk, dv) when ``fn`` runs on bf16 copies."""
    leaves = [t.to(BF16).requires_grad_() for t in (q, k, v)]
    out = fn(*leaves, mask)
    out.backward(grad.to(BF16))
    got = [out, *(t.grad for t in leaves)]
    return [(g.double() - r).abs().max().item() for g, r in zip(got, reference)]


def sdpa(q, k, v, mask, scale=None):
    causal = mask is None
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )


CASES = {  # (heads, kv heads, queries, keys, window): causal MHA, GQA, MQA, a sliding window, queries after cached keys
    "mha": (4, 4, 48, 48, None),
    "gqa": (6, 2, 48, 48, None),
    "mqa": (4, 1, 48, 48, None),
    "window": (4, 2, 48, 48, 8),
    "cached": (4, 2, 16, 48, None),
}


@pytest.mark.parametrize("case", CASES)
def test_values_and_gradients_match_float64(case):
    H, KV, Tq, Tk, window = CASES[case]
    torch.manual_seed(0)
    B, hd = 2, 16
    # inputs already on bf16's grid, so both sides see the same numbers
    q, k, v = (torch.randn(B, n, t, hd).to(BF16).double() for n, t in ((H, Tq), (KV, Tk), (KV, Tk)))
    grad = torch.randn(B, H, Tq, hd).to(BF16).double()
    mask = None
    if window is not None or Tq != Tk:
        distance = torch.arange(Tk - Tq, Tk)[:, None] - torch.arange(Tk)[None, :]
        mask = (distance >= 0) & (distance < (window or Tk))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = sdpa(*leaves, mask)
    out.backward(grad)
    reference = [out, *(t.grad for t in leaves)]

    ours = errors(lambda q, k, v, m: matmul_attention(q, k, v, m, hd**-0.5), q, k, v, grad, mask, reference)
    theirs = errors(sdpa, q, k, v, grad, mask, reference)
    for name, o, t in zip(("out", "dq", "dk", "dv"), ours, theirs):
        assert o <= 3 * t + 1e-2, f"{name}: {o:.3g} from float64 against SDPA bf16's {t:.3g}"
        assert o < 0.1, name


def test_a_wrong_scale_is_caught():
    """The comparison above has teeth: the same kernel with a scale off by 10% is far outside it."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 4, 32, 16).to(BF16).double() for _ in range(3))
    reference = sdpa(q, k, v, None)
    wrong = matmul_attention(q.to(BF16), k.to(BF16), v.to(BF16), None, 1.1 * 16**-0.5)
    assert (wrong.double() - reference).abs().max() > 0.1


def test_the_model_takes_this_path_only_for_bf16_training_shapes(monkeypatch):
    """Under bf16 autocast on the CPU every layer runs matmul_attention and the logits agree with the
    SDPA path to bf16 rounding; float32, dropout, ALiBi's float bias and long sequences stay with SDPA."""
    calls = []
    real = cpu_attention.matmul_attention
    monkeypatch.setattr(cpu_attention, "matmul_attention", lambda *a: calls.append(1) or real(*a))
    sizes = ["model.n_layer=2", "model.d_model=64", "model.attention.n_head=4", "model.context_length=32"]
    torch.manual_seed(0)
    model = build_model(compose_model(["model=nano", *sizes]))
    x = torch.randint(0, model.cfg.vocab_size, (2, 32))
    with torch.autocast("cpu", dtype=BF16):
        ours = model(x).float()
    assert len(calls) == 2
    monkeypatch.setattr(cpu_attention, "applies", lambda *a: False)
    with torch.autocast("cpu", dtype=BF16):
        theirs = model(x).float()
    torch.testing.assert_close(ours, theirs, rtol=0.05, atol=0.05)

    calls.clear()
    monkeypatch.undo()
    monkeypatch.setattr(cpu_attention, "matmul_attention", lambda *a: calls.append(1) or real(*a))
    model(x)  # float32
    alibi = build_model(compose_model(["model=nano", "model/position=alibi", *sizes]))
    with torch.autocast("cpu", dtype=BF16):
        alibi(x)
    dropped = build_model(compose_model(["model=nano", "model.attention.dropout=0.1", *sizes])).train()
    with torch.autocast("cpu", dtype=BF16):
        dropped(x)
    assert calls == []

    # long sequences stay with SDPA: past MAX_KEYS_TRAINING keys with gradients, MAX_KEYS_INFERENCE without
    long = build_model(compose_model(["model=nano", *sizes[:-1], "model.context_length=520"]))
    with torch.autocast("cpu", dtype=BF16):
        long(torch.randint(0, 8, (1, 520)))
        with torch.no_grad():
            long(torch.randint(0, 8, (1, 260)))
    assert calls == []
    with torch.autocast("cpu", dtype=BF16), torch.no_grad():
        long(torch.randint(0, 8, (1, 250)))
    assert len(calls) == 2

"""RWKV-4's time-mix (archlab/nn/mixers/rwkv4.py, its WKV in nn/mixers/ops/wkv.py): both WKV forms against the
recurrence written out token by token in float64 with plain sums (no running maximum), with padding and
document starts; keys whose naive exp overflows float32 over a long sequence; one layer against transformers'
``RwkvSelfAttention`` with every weight randomised; its count and cache by hand; the refusals. Registering it
gives it tests/test_mixer_contract.py's tests."""

from __future__ import annotations

import pytest
import torch
from helpers.mixers import mixer_config, randomise

from archlab import ConfigError, build_model
from archlab.accounting import kv_cache_bytes
from archlab.config import to_model_config
from archlab.nn.mixers.ops.wkv import wkv_chunked, wkv_recurrent
from archlab.nn.mixers.rwkv4 import RWKV4
from archlab.nn.validation import validate

pytestmark = pytest.mark.usefixtures("single_thread")

D, W, T = 8, 12, 11  # width of the model, of the WKV, length


def by_hand(w, u, k, v, keep, fresh):
    """Token by token in float64, the sums kept whole: wkv_t = (a + e^(u+k) v) / (b + e^(u+k)); then, at a
    present token, a = e^w a + e^k v, b = e^w b + e^k; a document start empties a and b first."""
    B, n, C = k.shape
    a, b = torch.zeros(B, C, dtype=torch.float64), torch.zeros(B, C, dtype=torch.float64)
    out = []
    for t in range(n):
        start = fresh[:, t, None]
        a, b = torch.where(start, 0.0, a), torch.where(start, 0.0, b)
        bonus = torch.exp(u + k[:, t])
        out.append((a + bonus * v[:, t]) / (b + bonus))
        present = keep[:, t, None]
        a = torch.where(present, torch.exp(w) * a + torch.exp(k[:, t]) * v[:, t], a)
        b = torch.where(present, torch.exp(w) * b + torch.exp(k[:, t]), b)
    return torch.stack(out, dim=1), a, b


def draws(B: int, n: int, C: int, key_scale: float = 2.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = -torch.exp(torch.randn(C, generator=g, dtype=torch.float64))
    u = torch.randn(C, generator=g, dtype=torch.float64)
    k = torch.randn(B, n, C, generator=g, dtype=torch.float64) * key_scale
    v = torch.randn(B, n, C, generator=g, dtype=torch.float64)
    keep = torch.rand(B, n, generator=g) > 0.25
    fresh = torch.rand(B, n, generator=g) > 0.8
    return w, u, k, v, keep, fresh


@pytest.mark.parametrize("chunk", [None, 1, 4, 5, 32])
def test_both_wkv_forms_are_the_recurrence_with_padding_and_documents(chunk):
    """The recurrence (chunk None) and chunks that do and do not divide the length, from an empty state and
    continuing from the state of a first part; the state they leave holds the sums a and b."""
    w, u, k, v, keep, fresh = draws(3, T, 5)
    want, a, b = by_hand(w, u, k, v, keep, fresh)

    def run(k, v, keep, fresh, state=None):
        if chunk is None:
            return wkv_recurrent(w, u, k, v, keep, fresh, state)
        return wkv_chunked(w, u, k, v, keep, fresh, state, chunk)

    out, state = run(k, v, keep, fresh)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    num, den, p = state.unbind(-1)
    torch.testing.assert_close(num * p.exp(), a, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(den * p.exp(), b, rtol=1e-12, atol=1e-12)
    cut = 4
    _, first = run(k[:, :cut], v[:, :cut], keep[:, :cut], fresh[:, :cut])
    rest, _ = run(k[:, cut:], v[:, cut:], keep[:, cut:], fresh[:, cut:], state=first)
    torch.testing.assert_close(rest, want[:, cut:], rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk", [None, 16])
def test_keys_whose_exp_overflows_float32_over_a_long_sequence(chunk):
    """Keys up to ~±400 (e^89 already overflows float32; the plain sums of the float64 reference hold them) over
    600 positions: float32 in both forms stays finite and agrees with the reference."""
    w, u, k, v, keep, fresh = draws(2, 600, 4, key_scale=100.0, seed=3)
    k = k.clamp(-400, 400)
    want, _, _ = by_hand(w, u, k, v, keep, fresh)
    assert torch.exp(k.float()).isinf().any()  # the naive form would overflow
    w, u, k, v = w.float(), u.float(), k.float(), v.float()
    if chunk is None:
        out, _ = wkv_recurrent(w, u, k, v, keep, fresh, None)
    else:
        out, _ = wkv_chunked(w, u, k, v, keep, fresh, None, chunk)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)


def layer(chunk: int = 4) -> RWKV4:
    cfg = mixer_config("rwkv4", d_model=D, attention={"kind": "rwkv4", "width": W, "scan_chunk": chunk})
    m = RWKV4(cfg).double()
    randomise(m, seed=1)
    return m


def test_a_layer_equals_transformers_rwkv_self_attention():
    """``RwkvSelfAttention`` (its torch path) with the same weights: the same output over a prompt, and the same
    continuation token by token from the state each keeps (HF's five-tensor state, archlab's KV cache). HF
    casts the keys to float32 inside its WKV, so the two agree to float32's rounding, not float64's. One
    sequence: HF's one-token step broadcasts a batch's shifted tokens [B, d] against [B, 1, d] to [B, B, d]."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.rwkv.modeling_rwkv import RwkvSelfAttention

    m = layer()
    config = transformers.RwkvConfig(hidden_size=D, attention_hidden_size=W, num_hidden_layers=1)
    hf = RwkvSelfAttention(config, 0).double()
    with torch.no_grad():
        for name in ("time_decay", "time_first"):
            getattr(hf, name).copy_(getattr(m, name))
        for name in ("time_mix_key", "time_mix_value", "time_mix_receptance"):
            getattr(hf, name).copy_(getattr(m, name)[None, None])
        for name in ("key", "value", "receptance", "output"):
            getattr(hf, name).weight.copy_(getattr(m, name).weight)
        x = torch.randn(1, T + 3, D, dtype=torch.float64)
        state = [torch.zeros(1, D, 1, dtype=torch.float64) for _ in range(2)]
        state += [torch.zeros(1, W, 1, dtype=torch.float64) for _ in range(3)]
        state[4] -= 1e30
        want, state = hf(x[:, :T], state=state, use_cache=True)
        cfg = mixer_config("rwkv4", d_model=D, attention={"kind": "rwkv4", "width": W}, n_layer=1)
        cache = build_model(cfg, dtype=torch.float64).new_cache(1, T + 3)
        torch.testing.assert_close(m(x[:, :T], cache=cache), want, rtol=0, atol=1e-6)
        cache.length = T
        for t in range(T, T + 3):
            want, state = hf(x[:, t : t + 1], state=state, use_cache=True)
            torch.testing.assert_close(m(x[:, t : t + 1], cache=cache), want, rtol=0, atol=1e-6)
            cache.length += 1


def test_count_and_cache_by_hand():
    """d = 8, W = 12: mixes 3·8, decay and bonus 2·12, key, value, receptance 3·8·12, output 12·8 = 456; the
    cache the last input (8) and num, den, exponent per channel (36) per layer, in float32: 2 layers × 44 × 4 B."""
    cfg = mixer_config("rwkv4", d_model=D, attention={"kind": "rwkv4", "width": W})
    assert RWKV4.num_params(cfg) == 24 + 24 + 288 + 96 == 432
    assert sum(p.numel() for p in RWKV4(cfg).parameters()) == 432
    assert RWKV4.kv_cache_values(cfg, 5, 0) == RWKV4.kv_cache_values(cfg, 5000, 0) == 44
    assert kv_cache_bytes(cfg, 4096, bytes_per_value=4) == 2 * 44 * 4


@pytest.mark.parametrize(
    ("field", "value"), [("width", 0), ("width", -3), ("scan_chunk", 0)]
)  # fmt: skip
def test_refusals_name_the_field(field, value):
    cfg = to_model_config({"attention": {"kind": "rwkv4", field: value}})
    with pytest.raises(ConfigError, match=f"model.attention.{field}"):
        validate(cfg)

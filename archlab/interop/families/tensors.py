"""Tensor maps: which Hugging Face tensor(s) each archlab tensor holds and in which layout (``TensorMap``),
the two conversions of a layout (``join``, ``split``), and ``Tensors``, which collects a record's maps."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from archlab.config import ModelConfig, n_kv_head
from archlab.config.layers import layer_configs
from archlab.nn.mixers.attention import v_head_dim
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff


class TensorMap(NamedTuple):
    """One archlab tensor and the HF tensor(s) it holds, in one of four layouts: ``same``;
        ``transposed`` (GPT-2's Conv1D stores (in, out)); ``stacked`` (archlab's fused q/k/v or gate/up is
        the HF tensors of ``sizes`` rows stacked along dim 0); ``heads_interleaved`` (GPT-NeoX's fused
        q/k/v holds [q_h, k_h, v_h] per head h; archlab holds every q, then every k, then every v;
        ``sizes`` = (n_head, head_dim)); ``experts_transposed`` (stacked experts stored [E, in, out], as
        gpt-oss's and Llama 4's, against archlab's [E, out, in]); ``gate_up_interleaved`` (gpt-oss's
        gate_up_proj [E, d, 2f] with the gate at even and up at odd columns, and its bias [E, 2f] likewise;
        archlab holds [E, 2f, d] and [E, 2f], the gate rows, then the up rows); ``flat`` (a tensor of shape
        ``sizes`` that archlab holds flattened: Cohere's per-head QK-norm scale [H, hd]); ``kv_grouped`` (Falcon's new
        decoder architecture: per key/value head g, its G = H / KV queries, then k_g, then v_g; ``sizes`` =
        (n_head, n_kv_head, head_dim)); ``offset_rows`` (OPT's position table: HF's rows from ``sizes[0]`` on are
        archlab's, the rows before them, which no token reads, written as zeros); ``qvk_sharded`` (CodeGen's fused
        qkv_proj: ``sizes[0]`` shards, each its slice of q, then of v, then of k); ``stacked_half_negated``
        (``stacked`` q, k, v of ``sizes[:3]`` rows, the second half of each q and k head's ``sizes[3]`` rows
        negated: NanoChat's RoPE turns the other way, which archlab's holds with those rows' signs flipped);
        ``gated_queries`` (Qwen3-Next's q_proj [H·2·hd] holds per head its query rows, then its output gate's:
        archlab's q/k/v from the query rows, k_proj and v_proj, ``sizes`` = (n_head, head_dim); written back
        with the gate's rows from ``others``, archlab's gate) and ``gated_queries_gate`` (archlab's gate, read
        from the gate rows; written by the ``gated_queries`` map); ``heads_paired`` (a projection holding per head
        h its ``sizes[1]`` rows of one archlab tensor, then its ``sizes[2]`` rows of another, ``sizes[0]`` heads:
        A.X K2's q_gate_proj, queries then output gate; archlab's first tensor, written back with the second's
        rows from ``others``) and ``heads_paired_second`` (the second, read from its rows; written by the first); ``deltanet_grouped`` (Qwen3-Next's Gated
        DeltaNet in_proj_qkvz holds per key head g its q_g, k_g, then the v and z rows of the value heads it
        serves, and in_proj_ba per key head their b, then their a; archlab's in_proj holds every q, k, v, z, b,
        then a; ``sizes`` = (key_heads, key_head_dim, n_head, v_head_dim)); ``depthwise_conv`` (nn.Conv1d's
        depthwise weight [C, 1, K], archlab's [C, K]); ``halves_interleaved`` (Zamba's Mamba in_proj: rows x_0, z_0,
    x_1, z_1, ...; archlab's every x row, then every z row); ``heads_merged`` (a tensor of shape ``sizes`` [H, n,
    ...] per head, as Zamba's Mamba holds x_proj, dt_proj, A_log and D; archlab's its first two dims merged);
    ``unflattened`` (a tensor HF holds flat, [n·d], that archlab holds of shape ``sizes``: Qwen4-Exp's stream norm
    scales, one row per stream)."""

    archlab: str
    hf: tuple[str, ...]
    layout: str = "same"
    sizes: tuple[int, ...] = ()
    others: tuple[str, ...] = ()  # further archlab tensors the HF tensors hold, which ``split`` reads too


def _negate_halves(x: Tensor, rows: int, hd: int) -> Tensor:
    """A copy of ``x`` with the second half of each head of ``hd`` rows among its first ``rows`` negated."""
    y = x.clone()
    y[:rows].unflatten(0, (-1, 2, hd // 2))[:, 1].neg_()
    return y


def join(m: TensorMap, parts: list[Tensor], copy: bool) -> Tensor:
    """The archlab tensor of ``m`` from its HF tensors (a copy when ``copy``; fused ones always are)."""
    if m.layout == "stacked":
        return torch.cat(parts)
    if m.layout == "transposed":
        return parts[0].t().contiguous()
    if m.layout == "heads_interleaved":
        H, hd = m.sizes
        return parts[0].unflatten(0, (H, 3, hd)).transpose(0, 1).flatten(0, 2).contiguous()
    if m.layout == "experts_transposed":
        return parts[0].transpose(1, 2).contiguous()
    if m.layout == "flat":
        return parts[0].flatten().clone() if copy else parts[0].flatten()
    if m.layout == "kv_grouped":
        H, KV, hd = m.sizes
        G = H // KV
        groups = parts[0].unflatten(0, (KV, G + 2, hd))
        return torch.cat((groups[:, :G].flatten(0, 2), groups[:, G].flatten(0, 1), groups[:, G + 1].flatten(0, 1)))
    if m.layout == "offset_rows":
        return parts[0][m.sizes[0] :].clone()
    if m.layout == "qvk_sharded":
        q, v, k = parts[0].unflatten(0, (m.sizes[0], 3, -1)).unbind(1)
        return torch.cat((q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)))
    if m.layout == "stacked_half_negated":
        return _negate_halves(torch.cat(parts), m.sizes[0] + m.sizes[1], m.sizes[3])
    if m.layout == "gate_up_interleaved":
        rows = parts[0].transpose(1, 2) if parts[0].dim() == 3 else parts[0]
        return torch.cat((rows[:, 0::2], rows[:, 1::2]), dim=1).contiguous()
    if m.layout == "experts_flat":  # DBRX's experts: [E·f, d] each; archlab's [E, f·len(parts), d], E = sizes[0]
        return torch.cat([p.unflatten(0, (m.sizes[0], -1)) for p in parts], dim=1)
    if m.layout == "experts_flat_transposed":  # DBRX's w2 [E·f, d]: archlab's down [E, d, f]
        return parts[0].unflatten(0, (m.sizes[0], -1)).transpose(1, 2).contiguous()
    if m.layout in ("gated_queries", "gated_queries_gate"):
        H, hd = m.sizes
        rows = parts[0].unflatten(0, (H, 2, hd))[:, int(m.layout == "gated_queries_gate")].flatten(0, 1)
        return torch.cat((rows, *parts[1:])) if m.layout == "gated_queries" else rows.clone()
    if m.layout in ("heads_paired", "heads_paired_second"):
        H, a, b = m.sizes
        first, second = parts[0].unflatten(0, (H, a + b)).split((a, b), dim=1)
        return (first if m.layout == "heads_paired" else second).flatten(0, 1).clone()
    if m.layout == "deltanet_grouped":
        Hk, dk, H, dv = m.sizes
        r = H // Hk  # value heads per key head
        q, k, v, z = parts[0].unflatten(0, (Hk, -1)).split((dk, dk, r * dv, r * dv), dim=1)
        b, a = parts[1].unflatten(0, (Hk, 2 * r)).split((r, r), dim=1)
        return torch.cat([x.flatten(0, 1) for x in (q, k, v, z, b, a)])
    if m.layout == "depthwise_conv":
        return parts[0][:, 0].clone()
    if m.layout == "halves_interleaved":  # HF's rows x_0, z_0, x_1, z_1, ...: archlab's every x, then every z
        return parts[0].unflatten(0, (-1, 2)).transpose(0, 1).flatten(0, 1).contiguous()
    if m.layout == "heads_merged":  # HF's [H, n, ...]: archlab's [H·n, ...]
        return parts[0].flatten(0, 1).clone() if copy else parts[0].flatten(0, 1)
    if m.layout == "unflattened":  # HF's [n·d]: archlab's [n, d] = sizes
        return parts[0].reshape(m.sizes).clone() if copy else parts[0].reshape(m.sizes)
    return parts[0].detach().clone() if copy else parts[0]


def split(m: TensorMap, tensor: Tensor, others: tuple[Tensor, ...] = ()) -> list[Tensor]:
    """The HF tensors of ``m`` from the archlab one and the ``others`` it names (the inverse of ``join``)."""
    if m.layout == "stacked":
        return [part.clone() for part in tensor.split(m.sizes)]
    if m.layout == "transposed":
        return [tensor.t().contiguous()]
    if m.layout == "heads_interleaved":
        H, hd = m.sizes
        return [tensor.unflatten(0, (3, H, hd)).transpose(0, 1).flatten(0, 2).contiguous()]
    if m.layout == "experts_transposed":
        return [tensor.transpose(1, 2).contiguous()]
    if m.layout == "flat":
        return [tensor.reshape(m.sizes).contiguous()]
    if m.layout == "kv_grouped":
        H, KV, hd = m.sizes
        q, k, v = tensor.split((H * hd, KV * hd, KV * hd))
        q, k, v = q.unflatten(0, (KV, H // KV, hd)), k.unflatten(0, (KV, 1, hd)), v.unflatten(0, (KV, 1, hd))
        return [torch.cat((q, k, v), dim=1).flatten(0, 2).contiguous()]
    if m.layout == "offset_rows":
        return [torch.cat((tensor.new_zeros(m.sizes[0], *tensor.shape[1:]), tensor))]
    if m.layout == "qvk_sharded":
        q, k, v = (x.unflatten(0, (m.sizes[0], -1)) for x in tensor.chunk(3))
        return [torch.stack((q, v, k), dim=1).flatten(0, 2).contiguous()]
    if m.layout == "stacked_half_negated":
        return list(_negate_halves(tensor, m.sizes[0] + m.sizes[1], m.sizes[3]).split(m.sizes[:3]))
    if m.layout == "gate_up_interleaved":
        f = tensor.shape[1] // 2
        rows = torch.stack((tensor[:, :f], tensor[:, f:]), dim=2).flatten(1, 2)
        return [(rows.transpose(1, 2) if rows.dim() == 3 else rows).contiguous()]
    if m.layout == "experts_flat":
        return [x.flatten(0, 1).contiguous() for x in tensor.chunk(len(m.hf), dim=1)]
    if m.layout == "experts_flat_transposed":
        return [tensor.transpose(1, 2).flatten(0, 1).contiguous()]
    if m.layout == "gated_queries":
        H, hd = m.sizes
        q, kv = tensor.split((H * hd, tensor.shape[0] - H * hd))
        rows = torch.stack((q.unflatten(0, (H, hd)), others[0].unflatten(0, (H, hd))), dim=1).flatten(0, 2)
        return [rows.contiguous(), *(part.clone() for part in kv.chunk(2))]
    if m.layout == "gated_queries_gate":
        return []  # the gated_queries map writes q_proj, gate rows included
    if m.layout == "heads_paired":
        H, a, b = m.sizes
        return [torch.cat((tensor.unflatten(0, (H, a)), others[0].unflatten(0, (H, b))), dim=1).flatten(0, 1)]
    if m.layout == "heads_paired_second":
        return []  # the heads_paired map writes the fused projection
    if m.layout == "deltanet_grouped":
        Hk, dk, H, dv = m.sizes
        q, k, v, z, b, a = (x.unflatten(0, (Hk, -1)) for x in tensor.split((Hk * dk, Hk * dk, H * dv, H * dv, H, H)))
        return [torch.cat((q, k, v, z), dim=1).flatten(0, 1), torch.cat((b, a), dim=1).flatten(0, 1)]
    if m.layout == "depthwise_conv":
        return [tensor[:, None].clone()]
    if m.layout == "halves_interleaved":
        return [tensor.unflatten(0, (2, -1)).transpose(0, 1).flatten(0, 1).contiguous()]
    if m.layout == "heads_merged":
        return [tensor.reshape(m.sizes).contiguous()]
    if m.layout == "unflattened":
        return [tensor.flatten().contiguous()]
    return [tensor]


class Tensors:
    """Collects a family's TensorMaps: a module's weight and, when it has one, its bias."""

    def __init__(self, cfg: ModelConfig):
        self.cfg, self.maps = cfg, []

    def add(self, archlab: str, hf: str, bias: bool = False, layout: str = "same", sizes: tuple = ()) -> None:
        self.maps.append(TensorMap(f"{archlab}.weight", (f"{hf}.weight",), layout, sizes))
        if bias:
            self.maps.append(
                TensorMap(f"{archlab}.bias", (f"{hf}.bias",), "same" if layout == "transposed" else layout, sizes)
            )

    def layers(self, **norms: str) -> Iterator[tuple[ModelConfig, str, str]]:
        """Each layer's config and its tensors' prefixes, archlab's ``blocks.<i>`` and HF's ``model.layers.<i>``,
        after mapping its ``norms`` (archlab's block norm = the HF module under the layer: ``attn_norm=
        "input_layernorm"``), as most decoders name them."""
        for i, lc in enumerate(layer_configs(self.cfg)):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            for ours, theirs in norms.items():
                self.add(f"{b}.{ours}", f"{h}.{theirs}")
            yield lc, b, h

    def stacked(self, archlab: str, hf: list[str], bias: bool, sizes: tuple[int, ...]) -> None:
        """archlab's fused Linear = the HF Linears ``hf`` stacked along their output rows."""
        self.maps.append(TensorMap(f"{archlab}.weight", tuple(f"{n}.weight" for n in hf), "stacked", sizes))
        if bias:
            self.maps.append(TensorMap(f"{archlab}.bias", tuple(f"{n}.bias" for n in hf), "stacked", sizes))

    def qkv(self, archlab: str, hf_attn: str, bias: bool) -> None:
        """Separate q_proj, k_proj, v_proj (the causal kind's value heads of their own width, ``v_head_dim``)."""
        cfg = self.cfg
        vd = v_head_dim(cfg) if cfg.attention.kind == "causal" else head_dim(cfg)
        sizes = (cfg.attention.n_head * head_dim(cfg), n_kv_head(cfg) * head_dim(cfg), n_kv_head(cfg) * vd)
        self.stacked(archlab, [f"{hf_attn}.{x}_proj" for x in "qkv"], bias, sizes)

    def gate_up(self, archlab: str, hf_mlp: str, bias: bool) -> None:
        """archlab's [gate | up] = gate_proj, up_proj."""
        self.stacked(archlab, [f"{hf_mlp}.gate_proj", f"{hf_mlp}.up_proj"], bias, (d_ff(self.cfg), d_ff(self.cfg)))

    def head(self) -> list[TensorMap]:
        """The untied head's weight and the head's bias, then every map collected."""
        if not self.cfg.head.tied:
            self.maps.append(TensorMap("head.weight", ("lm_head.weight",)))
        if self.cfg.head.bias:
            self.maps.append(TensorMap("head.bias", ("lm_head.bias",)))
        return self.maps

"""GPU kernels for the recurrent mixers' chunked scans, used when installed and the operands are on a CUDA
device: flash-linear-attention's ``chunk_gated_delta_rule`` for Gated DeltaNet (the ``fla`` extra) and
mamba_ssm's ``mamba_chunk_scan_combined`` for Mamba-2 (the ``mamba`` extra). Each takes the torch form's
arguments after the same gates, so only the scan changes; the torch forms (``chunked_delta_rule``,
``chunked_ssd``) stay the reference, and tests/test_kernels.py checks each kernel against them on a GPU."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from types import ModuleType
from typing import Optional

import torch
from torch import Tensor

# the dtypes the kernels compute in; a float64 model keeps the torch forms
_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def _load(module: str) -> Optional[ModuleType]:
    """``module`` imported, or None where its package is not installed."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        return None
    return importlib.import_module(module)


def _on_gpu(x: Tensor) -> bool:
    return x.is_cuda and x.dtype in _KERNEL_DTYPES


def delta_rule_applies(x: Tensor) -> bool:
    """flash-linear-attention's kernel, rather than ``chunked_delta_rule``, for operands like ``x``?"""
    return _on_gpu(x) and _load("fla.ops.gated_delta_rule") is not None


def ssd_applies(x: Tensor) -> bool:
    """mamba_ssm's kernel, rather than ``chunked_ssd``, for operands like ``x``?"""
    return _on_gpu(x) and _load("mamba_ssm.ops.triton.ssd_combined") is not None


def delta_rule(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Optional[Tensor] = None
) -> tuple[Tensor, Tensor]:
    """``chunked_delta_rule`` (its heads-first arguments and results, q already scaled) by
    flash-linear-attention, which takes positions first and the scale as an argument."""
    fla = _load("fla.ops.gated_delta_rule")
    assert fla is not None, "delta_rule_applies() first"
    o, final = fla.chunk_gated_delta_rule(
        *(t.transpose(1, 2) for t in (q, k, v, g, beta)), scale=1.0, initial_state=state, output_final_state=True
    )
    return o.transpose(1, 2), final


def ssd(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk: int, state: Optional[Tensor] = None
) -> tuple[Tensor, Tensor]:
    """``chunked_ssd`` (the same arguments and results: dt after its softplus and clamp, no D skip, no gate)
    by mamba_ssm, whose layouts are the same."""
    ssd_combined = _load("mamba_ssm.ops.triton.ssd_combined")
    assert ssd_combined is not None, "ssd_applies() first"
    y, final = ssd_combined.mamba_chunk_scan_combined(
        x, dt, A, B, C, chunk_size=chunk, initial_states=state, return_final_states=True
    )
    return y, final

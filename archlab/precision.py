"""The precision a run computes in. ``trainer.precision=auto`` takes bf16 autocast (``bf16-mixed``) where
the hardware multiplies bf16 natively (a CUDA GPU that supports it; a CPU with AVX-512 BF16 or AMX, for a
model of d_model >= ``CPU_BF16_MIN_D_MODEL``), and float32 (``32-true``) elsewhere, where bf16 would be
emulated and slower, or on a CPU the casts outweigh the smaller matmuls (docs/performance.md).
``check_device`` refuses a ``device`` setting this machine cannot run on."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional

import torch

from archlab.errors import ConfigError

# /proc/cpuinfo flags of CPUs with bf16 matmul instructions: x86 AVX-512 BF16 and AMX, Arm's BF16 extension
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
# the narrowest model auto runs under bf16 autocast on a CPU: narrower, its small matmuls gain less than
# autocast's casts cost, or nothing (docs/performance.md: d_model 64 and 128 slower or no faster, 384 faster)
CPU_BF16_MIN_D_MODEL = 256


def cpu_bf16_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """The bf16 instruction sets this CPU reports, sorted (none where /proc/cpuinfo does not exist)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return []
    words = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):  # x86 | aarch64
            words.update(value.split())
    return sorted(words.intersection(NATIVE_BF16_FLAGS))


# Lightning precision -> the dtype matmuls compute in and activations (the KV cache too) are held in
_COMPUTE_DTYPES = {
    "bf16-mixed": torch.bfloat16,
    "bf16-true": torch.bfloat16,
    "bf16": torch.bfloat16,
    "16-mixed": torch.float16,
    "16-true": torch.float16,
    "16": torch.float16,
}


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype a run or a benchmark at ``precision`` computes in (float32 unless 16-bit)."""
    return _COMPUTE_DTYPES.get(str(precision), torch.float32)


@functools.cache
def _native_cpu_bf16() -> tuple[str, ...]:
    return tuple(cpu_bf16_flags())


def resolve_precision(precision: str, accelerator: str, d_model: Optional[int] = None) -> tuple[str, str]:
    """The precision Lightning gets for ``trainer.precision`` on ``trainer.accelerator`` for a model of
    width ``d_model`` (None: any), and why (one phrase for the run's log and summary.json). Anything but
    ``auto`` is kept as set."""
    if str(precision) != "auto":
        return str(precision), "as set by trainer.precision"

    gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if gpu:
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return "bf16-mixed", "auto: the GPU computes bf16 natively"
        return "32-true", "auto: no GPU bf16 support found"
    flags = _native_cpu_bf16()
    if flags and d_model is not None and d_model < CPU_BF16_MIN_D_MODEL:
        return "32-true", (
            f"auto: this CPU multiplies bf16 natively ({', '.join(flags)}), but at d_model={d_model} "
            f"(< {CPU_BF16_MIN_D_MODEL}) bf16 autocast's casts outweigh its faster matmuls"
        )
    if flags:
        return "bf16-mixed", f"auto: this CPU multiplies bf16 natively ({', '.join(flags)})"
    return "32-true", "auto: this CPU has no bf16 matmul instructions (bf16 would be emulated)"


def check_device(name: str, auto: bool = False) -> None:
    """Refuse a ``device`` setting this machine cannot run on: not cpu, cuda or cuda:<index> (nor
    ``auto``, where ``auto`` is allowed), or cuda without a CUDA GPU."""
    choices = "auto, cpu, cuda or cuda:<index>" if auto else "cpu, cuda or cuda:<index>"
    if auto and name == "auto":
        return
    try:
        kind = torch.device(name).type
    except RuntimeError:
        raise ConfigError("device", name, choices) from None
    if kind not in ("cpu", "cuda"):
        raise ConfigError("device", name, choices)
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", name, f"{'auto or ' if auto else ''}cpu: this machine has no CUDA GPU")

"""Peak dense FLOP/s of known accelerators per compute dtype: the one denominator of MFU, so that
archlab-train's throughput and archlab-bench report the same MFU for the same work on the same device."""

from __future__ import annotations

import re
from typing import Optional

import torch

TF32 = "tf32"  # float32 matmuls on tensor cores: torch.get_float32_matmul_precision() other than "highest"

# Words of a CUDA device name -> FLOP/s per dtype, from NVIDIA's datasheets, without sparsity. The first
# entry whose words all appear in the name applies, so a specific model (H100 PCIe) precedes its family
# (H100: the SXM part). A dtype not listed (A10G's float32 is unpublished) has no MFU.
PEAK_FLOPS: dict[str, dict[object, float]] = {
    "h100 pcie": {torch.float32: 51.2e12, TF32: 378e12, torch.bfloat16: 756e12, torch.float16: 756e12},
    "h100 nvl": {torch.float32: 60e12, TF32: 417.5e12, torch.bfloat16: 835.5e12, torch.float16: 835.5e12},
    "h100": {torch.float32: 66.9e12, TF32: 494.7e12, torch.bfloat16: 989.4e12, torch.float16: 989.4e12},
    "h200 nvl": {torch.float32: 60e12, TF32: 417.5e12, torch.bfloat16: 835.5e12, torch.float16: 835.5e12},
    "h200": {torch.float32: 66.9e12, TF32: 494.7e12, torch.bfloat16: 989.4e12, torch.float16: 989.4e12},
    "a100": {torch.float32: 19.5e12, TF32: 156e12, torch.bfloat16: 312e12, torch.float16: 312e12},
    "l4": {torch.float32: 30.3e12, TF32: 60e12, torch.bfloat16: 121e12, torch.float16: 121e12},
    "a10g": {torch.bfloat16: 70e12, torch.float16: 70e12},
    "rtx 4090": {torch.float32: 82.6e12, TF32: 82.6e12, torch.bfloat16: 165.2e12, torch.float16: 165.2e12},
}


def device_peak(name: str, dtype: torch.dtype, tf32: bool) -> Optional[float]:
    """The peak of the device called ``name`` (as ``torch.cuda.get_device_name`` gives it) computing in
    ``dtype``, float32 as TF32 when ``tf32``; None when the table does not know it."""
    words = set(re.split(r"[\s_-]+", name.lower()))  # "NVIDIA A100-SXM4-80GB": a100 sxm4 80gb
    for model, peaks in PEAK_FLOPS.items():
        if set(model.split()) <= words:
            return peaks.get(TF32 if dtype == torch.float32 and tf32 else dtype)
    return None


def peak_flops(device: torch.device, dtype: torch.dtype) -> Optional[float]:
    """The peak FLOP/s of one ``device`` computing in ``dtype`` as torch will run it now; None for a
    CPU or an unknown GPU (MFU is then not reported)."""
    if device.type != "cuda":
        return None
    tf32 = torch.get_float32_matmul_precision() != "highest"
    return device_peak(torch.cuda.get_device_name(device), dtype, tf32)

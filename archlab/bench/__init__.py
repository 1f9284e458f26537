"""archlab-bench: archlab against Hugging Face on the same layout in one process (``harness.py``), and the
datasheet peaks that MFU divides by (``peak_flops.py``, which archlab-train's throughput reads too)."""

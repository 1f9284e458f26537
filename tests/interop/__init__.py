"""The Hugging Face conversion's tests (archlab/interop): ``test_hf.py`` the machinery (archlab/interop/hf.py,
shown on GPT-2, GPT-J and LLaMA), ``test_refused.py`` the families archlab refuses, and one file per
family (archlab/interop/families/<module>.py), named after it: its parity with transformers (tiny random
models give the same float32 logits both ways and through files, decode as HF ``generate`` does), the
layouts it holds and what it refuses. What they share is in tests/helpers/hf.py. A package, so that a
family's file may share a name with a part's (tests/interop/test_mamba2.py beside tests/test_mamba2.py)."""

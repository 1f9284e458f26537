"""What several test files share, imported as ``helpers.<module>`` (pyproject.toml puts tests/ on the path):
``training`` (a tiny datamodule, callbacks and the ``archlab-train`` calls of the training tests),
``faults`` (callbacks that slow a run, poison a step or record weights), ``hf`` (sizes, randomised
weights, and the parity checks each Hugging Face family's file, tests/interop/test_<family>.py, calls),
``parts`` (the tiny configs, random float64 models, the attention written out and the short fit of the
effect tests of model parts), ``mixers`` (each registered mixer's tiny sizes, the tiny models built from
them and their randomised weights: the mixer tests') and ``published`` (the published parameter counts and
``config.json`` values the presets are held to)."""

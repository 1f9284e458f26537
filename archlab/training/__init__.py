"""Training with Lightning: ``run.train(cfg)`` is the body of ``archlab-train`` (see docs/training.md)."""

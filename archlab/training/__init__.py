"""Training with Lightning: ``run.train(cfg)`` is the body of ``archlab-train`` (see README "Training")."""

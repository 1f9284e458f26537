"""Evaluating a trained model: lm-evaluation-harness tasks through an adapter over archlab's Decoder
(``harness``), held-out perplexity (``perplexity``), and the model a run, checkpoint or export holds
(``models``)."""

"""archlab-report: a sweep directory turned into an ablation table and plots (``write.py``), from its runs
(``runs.py``), with the options beyond the table (``analysis.py``: baseline and best-over in ``compare.py``,
scaling fits in ``scaling.py``), the best runs and grid-edge warnings (``best.py``), training stability
(``stability.py``), their arithmetic (``stats.py``), number formats (``text.py``) and figures (``plots.py``)."""

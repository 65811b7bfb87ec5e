"""The BD3-LM perplexity ladder (Table 3) and clipped-schedule variance (Table 2), any scale.

- ``python -m experiments.perplexity``: the entry point (this package's ``__main__.py``)

Its modules: ``config`` (data, architecture, training, evaluation, presets), ``jobs`` (training and
evaluation jobs), ``report`` (tables and plot from the JSONL file), ``seeds`` (several training
seeds and the report across them).
"""

"""The entry points, grouped by role in subpackages, each run as ``python -m experiments.<role>.<name>``
(or ``python -m experiments.<role>`` for a package with a ``__main__.py``). The library they build on
is ``harness``; each subpackage's docstring lists its entry points.

- ``experiments.cli``: generate, trace, lm-eval models (a user's commands)
- ``experiments.eval``: the evaluations (GSM8K-format strategy tables, any-order tasks, cache drift)
- ``experiments.bench``: speed, load and compute-cost benchmarks
- ``experiments.train``: training the embedded models
- ``experiments.perplexity``: the BD3-LM perplexity ladder (``python -m experiments.perplexity``)
- ``experiments.reproduce``: every artefact of ``results/`` in one command
  (``python -m experiments.reproduce``) and the README's headline
"""

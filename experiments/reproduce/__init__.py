"""Every artefact of ``results/`` from one command, and the README's headline computed from them.

- ``python -m experiments.reproduce``: run the plan's jobs (this package's ``__main__.py``; ``--list`` prints it)
- ``python -m experiments.reproduce.headline``: the README's headline table and ``docs/results.md``

Its modules: ``plan`` (every job and its command), ``jobs`` (``Job``, the GSM8K table jobs),
``anyorder`` and ``chain`` (the any-order / load / speed jobs, the ``llada-chain`` tables).
"""

"""The evaluation harness as a library: results files, the one evaluation loop, reports and
plots, the roofline, the samplers' grids and command-line flags, and the entry points' plumbing.

It builds on ``dlm``, ``tasks`` and the method packages and never imports ``experiments`` (the
entry points) or ``research`` (the probes); both import it.

- ``results``: results I/O that never loses work (``JsonlLog``, ``read_jsonl``, ``config_hash``,
  ``git_sha``, ``atomic_write_text``, ``write_if_changed``; the locks of :mod:`dlm.locks`), prompts
  and decoded answers
- ``records``: the per-sample record checked before it is believed (the report and every resume)
- ``problem_sets``: rows of one table over different problems, noted or restricted to the common ones
- ``evaluate``: the one evaluation path, a ``dlm.spec.Sampler`` over GSM8K-format problems
- ``report``: tables, Pareto plot and factorial ablation of a GSM8K harness run
  (``python -m harness.report --out DIR`` rebuilds them from the run's JSONL files)
- ``frontier``: the Pareto front under every table and its fastest row not significantly worse
- ``plots`` / ``plot_labels``: the accuracy-vs-throughput plot and its non-overlapping labels
- ``roofline``: the roofline cost model the benchmarks report against
- ``shapes``: the speed benchmarks' model shapes (named sizes, real models' shapes)
- ``grids``: the samplers of a results table, built from one set of numbers
- ``sampler_flags``: the sampler's command-line flags and lm-eval ``model_args``, from the registry
- ``cli``: the entry points' parser, ``run_main`` (one-line user errors), common flags, threads
"""

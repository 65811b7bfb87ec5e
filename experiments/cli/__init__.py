"""A user's commands.

- ``python -m experiments.cli.generate``: generate from a prompt with any sampler (``--stream`` shows the steps)
- ``python -m experiments.cli.trace``: the denoising trace of one prompt, which step committed each position
- ``python -m experiments.cli.lm_eval_models``: lm-evaluation-harness with the ``fastdllm`` and ``bd3lm``
  models (task configs in ``experiments/cli/lm_eval_tasks/``)
"""

"""Training the embedded models.

- ``python -m experiments.train.train_llada``: the embedded LLaDA-style model from scratch, in three phases
- ``python -m experiments.train.train_bd3lm``: fine-tune a bidirectional checkpoint to BD3-LM block size L'
- ``python -m experiments.train.train_anyorder``: the any-order task models, AR and masked diffusion alike
  (its held-out sets: :mod:`tasks.anyorder`; its curves and flattening stop: :mod:`harness.run_records`)
"""

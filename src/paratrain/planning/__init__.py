"""Memory plans before launch: ``paratrain plan train.py --nproc N`` runs one training step of the
script on fake tensors and predicts each rank's peak memory under each strategy.

- :mod:`paratrain.planning.probe`: the hooks ``pt.Run`` calls in plan mode.
- :mod:`paratrain.planning.fake_run`: runs the script on fake tensors (one process per plan).
- :mod:`paratrain.planning.memory`: the per-strategy breakdowns and the recommendation.
"""

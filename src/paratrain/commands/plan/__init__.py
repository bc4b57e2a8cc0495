"""``paratrain plan``: will it fit, and with which strategy.

- :mod:`.command`: the command line, the table and the recommendation.
- :mod:`.fake_run`: runs the script on fake tensors up to its first step (a process per plan),
  through the hooks ``pt.Run`` calls in plan mode (:mod:`paratrain.runtime.plan_probe`).
- :mod:`.memory`: each strategy's peak per rank, derived from that step.
"""

"""The runtime of ``pt.Run``: what a run holds and does while a training loop runs.

``run`` (the public ``Run``), ``run_base`` (its console, logging and weights), ``loop_hooks`` (the
run's reactions to the loop), ``checkpoints`` and ``save_restore`` (the run's side of checkpoints:
what is saved, what a resume restores), ``registry`` (what a checkpoint holds), ``stepping``,
``accumulation`` and ``precision`` (one optimizer step), ``model_setup``, ``seeding``, ``rng``,
``per_rank``, ``loop_state``, ``stats``, ``console`` and ``final_state``. The run dir's layout
(:mod:`paratrain.core.run_dir`) sits below, shared with the commands.
"""

"""Launching: ``paratrain run`` (torchrun, Slurm-aware) and ``paratrain.launch`` (in-process)."""

"""Launching ranks: ``paratrain run`` (torchrun, Slurm-aware) and ``paratrain.launch``.

``plan`` builds the one torchrun command line (``paratrain run`` and ``paratrain demo``),
``supervise`` runs it, ``command`` explains how it ended; ``ranks`` is the one spawner of local
rank processes (``paratrain.launch`` in ``spawn``, bench, doctor, the test harness);
``preflight`` checks settings as a rank would, before any starts (demo, bench).
"""

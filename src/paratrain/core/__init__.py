"""What every layer may use: fault injection for ``paratrain verify-resume`` (``faults``), path
checks (``paths``), the run dir's layout (``run_dir``) and the version (``version``). It imports
nothing of paratrain but ``paratrain.errors``."""

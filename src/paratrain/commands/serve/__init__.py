"""``paratrain serve``: the container's entrypoint (Jupyter with a token, SSH with keys only)."""

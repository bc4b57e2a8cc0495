"""``paratrain monitor``: a live per-GPU and per-rank view of a running job."""

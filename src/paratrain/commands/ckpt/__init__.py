"""``paratrain ckpt``: inspect, verify, convert and diff checkpoints."""

"""``paratrain ckpt``: inspect, verify, convert, reshard and diff checkpoints."""

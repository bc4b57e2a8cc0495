"""How a model is laid out over ranks: tensor-parallel plans (``tp``, applied by ``tp_split``),
pipeline stages (``pipeline_stages``), meshes, module policies and activation checkpointing."""

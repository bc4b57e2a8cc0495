"""``paratrain bench``: throughput, step time and memory per configuration, against a
hand-written reference loop, as a table, JSON and plots. See
:mod:`paratrain.commands.bench.command`."""

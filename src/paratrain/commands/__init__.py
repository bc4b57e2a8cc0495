"""The tools built on the library: the ``paratrain`` command line and each of its commands.

    paratrain run / doctor / check / ckpt / bench / verify-resume / monitor / serve / demo

``cli.py`` is the entry point (it dispatches to ``<command>/command.py``); ``run/`` is
``paratrain run`` (torchrun and Slurm launches, supervision, failure summaries). Nothing in the
library imports this package.
"""

"""``paratrain check``: find multi-GPU mistakes in training scripts without running them.

    paratrain check train.py scripts/          # ruff-like lines, exit 1 when something is found
    paratrain check --select PT001,PT006 train.py
    paratrain check --sarif train.py > check.sarif

    from paratrain.commands.check.engine import check_paths
    report = check_paths([Path("train.py")])
    for finding in report.findings: ...

Scripts are parsed with :mod:`ast`, never imported or run. Each rule lives in a ``rules_*``
module grouped by topic; :mod:`paratrain.commands.check.findings` holds the registry.
"""

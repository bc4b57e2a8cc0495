"""``python -m paratrain`` is the ``paratrain`` command."""

import sys

from paratrain.commands.cli import main

sys.exit(main())

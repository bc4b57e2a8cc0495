"""``paratrain plan``: will it fit, and with which strategy (see :mod:`.command`)."""

"""``paratrain doctor``: what this machine has, what is wrong with it, and how to fix it."""

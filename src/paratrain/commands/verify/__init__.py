"""``paratrain verify-resume``: prove a script restart-safe by killing it and comparing states.

The runtime side (the event trace, the kill, the final state) is :mod:`paratrain.core.faults` and
:mod:`paratrain.runtime.final_state`; here: choosing kill points (``kill_points``), launching runs
(``runs``), loading and comparing what they leave (``states``, ``compare``), the procedure
(``runner``) and what it found (``report``), and its table (``render``, ``command``).
"""

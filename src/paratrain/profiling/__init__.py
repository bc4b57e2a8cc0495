"""Profiling a run's own loop (``step_profiler``), its summary, and memory figures."""

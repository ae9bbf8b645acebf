"""The Ray side: the session (init, logs, errors), placement, warm worker slots, orchestration, progress.

Imports core and training (training only inside the functions that run a trial).
"""

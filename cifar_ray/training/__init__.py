"""The training side, on torch: CIFAR-10 data and its safe unpickler, models, optimizers, comm hooks, the loop.

Imports torch, never Ray at import time (the loop's Ray entry point imports it inside). Imports only core.
"""

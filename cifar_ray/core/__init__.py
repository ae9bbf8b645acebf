"""The core: errors, the strict config, sweep files, the run log, storage, status, checkpoints' layout, sysinfo.

Imports neither torch nor Ray at import time (the CLI's --help, --dry-run, status and errors need neither):
sysinfo imports them inside its functions only. Imports nothing of cifar_ray outside core.
"""

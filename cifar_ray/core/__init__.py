"""The core: errors, the strict config, sweep files, the run log, a run's options and the owner of its folder, the
trial record, storage, status, checkpoints' layout, sysinfo.

Imports neither torch nor Ray, not even inside a function (the CLI's --help, --dry-run, status and errors need
neither; tests/test_layers.py checks it). Imports nothing of cifar_ray outside core.
"""

"""The `cifar-ray` subcommands, a module each: its parser (`add_parser`: arguments, help, `EXAMPLES`) and its
handler (`run`: parsed arguments in, exit status out). Their imports at module level are neither torch nor Ray, so
`--help` and the fast paths stay fast; each `run` imports what it needs."""

from types import ModuleType

from . import bench, check, export, keys, report, status, sweep, train

# name -> module, in the order `cifar-ray --help` lists them. A new subcommand: a module here and one entry.
COMMANDS: dict[str, ModuleType] = {
    "train": train,
    "sweep": sweep,
    "bench": bench,
    "report": report,
    "keys": keys,
    "status": status,
    "check": check,
    "export": export,
}

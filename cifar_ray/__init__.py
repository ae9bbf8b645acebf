"""cifar-ray: a Ray-based sweep orchestrator for data-parallel CNN training on CIFAR-10.

The Python API (cifar_ray/api.py, docs/api.md) is exported here but imported on first use, so `import cifar_ray`
stays as cheap as the command line's fast paths need: `cifar_ray.sweep(...)`, `cifar_ray.load(...)`, ... The API's
`report` is not among them: `cifar_ray.report` is the report package (`Run.report`, or `cifar_ray.api.report`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import Run, load, pool, sweep, sweep_plan, train, train_plan

__all__ = ["Run", "load", "pool", "sweep", "sweep_plan", "train", "train_plan"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

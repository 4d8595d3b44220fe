"""ios-ray: the IOS inter-operator scheduler, measured through Ray.

::

    import ios_ray

    result = ios_ray.search(model, devices=["cpu"], batches=[1, 8])    # find and check the schedules
    fast = result.deploy(model)                                        # run them: a ScheduledModule
    fast = ios_ray.optimize(model, example_input)                      # both in one call, on this machine
    fast = torch.compile(model, backend="ios_ray")                     # the schedules searched, under torch.compile
    fast = torch.compile(model, backend=ios_ray.backend(on_miss="search"))   # ... with options

The API loads on first use, so importing a part of the package (``ios_ray.runtime`` to deploy, say) does not load
Ray or DuckDB. Its errors are one sentence each, of a type a caller can catch (:mod:`ios_ray.errors`): ``UserError``
for anything the user can fix, and among those ``ImportRefused`` (a model ios-ray cannot import),
``DeviceUnavailable`` (a device it does not know, or no node offers) and ``StoreUnusable`` (a latency store it cannot
use).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ios_ray.errors import DeviceUnavailable, ImportRefused, StoreUnusable, UserError

#: The names of the API and the module each is loaded from.
_API = {"search": "ios_ray.app.api", "optimize": "ios_ray.app.api", "SearchResult": "ios_ray.app.api",
        "backend": "ios_ray.app.backend"}

if TYPE_CHECKING:
    from ios_ray.app.api import SearchResult, optimize, search
    from ios_ray.app.backend import backend


def __getattr__(name: str) -> Any:
    """Load the API (``ios_ray.app.api``, ``ios_ray.app.backend``) when one of its names is first asked for."""
    if name not in _API:
        raise AttributeError(f"module 'ios_ray' has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)


__all__ = ["search", "optimize", "SearchResult", "backend", "UserError", "ImportRefused", "DeviceUnavailable",
           "StoreUnusable"]

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

# Re-exported (``as`` marks a re-export): light, so that ``except ios_ray.UserError`` loads nothing more.
from ios_ray.errors import DeviceUnavailable as DeviceUnavailable, ImportRefused as ImportRefused
from ios_ray.errors import StoreUnusable as StoreUnusable, UserError as UserError

#: The public API, listed once: each name, the module it is loaded from, and its stability: ``stable`` (kept
#: compatible within a minor version; a change is announced a minor version ahead) or ``provisional`` (may change in
#: any version). Everything else in the package is internal, whatever its spelling.
API: dict[str, tuple[str, str]] = {
    "search": ("ios_ray.app.search.api", "stable"),
    "optimize": ("ios_ray.app.search.api", "stable"),
    "SearchResult": ("ios_ray.app.search.api", "stable"),
    "backend": ("ios_ray.app.compile.backend", "stable"),
    "ScheduledModule": ("ios_ray.runtime", "stable"),
    "UserError": ("ios_ray.errors", "stable"),
    "ImportRefused": ("ios_ray.errors", "provisional"),
    "DeviceUnavailable": ("ios_ray.errors", "provisional"),
    "StoreUnusable": ("ios_ray.errors", "provisional"),
}

if TYPE_CHECKING:
    from ios_ray.app.compile.backend import backend as backend
    from ios_ray.app.search.api import SearchResult as SearchResult, optimize as optimize, search as search
    from ios_ray.runtime import ScheduledModule as ScheduledModule


def __getattr__(name: str) -> Any:
    """Load a name of the API (:data:`API`) when it is first asked for."""
    if name not in API:
        raise AttributeError(f"module 'ios_ray' has no attribute {name!r}")
    return getattr(importlib.import_module(API[name][0]), name)


__all__ = [*API, "API"]

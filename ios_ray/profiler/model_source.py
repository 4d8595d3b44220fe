"""Rebuilding on an actor the model a job names (:class:`~ios_ray.profiler.jobs.ModelSource`): by spec or object.

A model given by spec (a zoo name or ``package.module:factory``) is built on each actor from its own code, seeded,
so every actor binds the same weights. A model given as an ``nn.Module`` object (from a notebook, say) is put into
Ray's object store once by the driver and fetched by each actor that measures on a real device. Unpickling it on
another node needs the model's code there: cloudpickle sends classes defined in ``__main__`` by value, but a class
from an importable module by reference, and that module must then be importable on the node.
"""

from __future__ import annotations


import ray
from torch import nn

from ios_ray.errors import UserError, first_line
from ios_ray.frontend import Imported, Model, import_model, load_model
from ios_ray.profiler.jobs import ModelSource


def import_source(source: ModelSource, dtype: str, memory_format: str) -> Imported:
    """Build (seeded, as on the driver) or fetch the model of a source and import it in ``dtype`` and
    ``memory_format`` (its graph can depend on both, as on the driver); UserError where it cannot."""
    return import_model(load_source(source), dtype=dtype, memory_format=memory_format)


def load_source(source: ModelSource) -> Model:
    """Build (seeded, as on the driver) or fetch the model of a source; UserError where it cannot."""
    return load_model(source.spec if source.spec is not None else _fetch(source), source.input_shape, source.name)


def _fetch(source: ModelSource) -> nn.Module:
    """The driver's module object from Ray's object store."""
    try:
        module: nn.Module = ray.get(source.module_ref)
        return module
    except Exception as error:  # noqa: BLE001 - unpickling can fail in many ways; all mean "code not here"
        host = ray.util.get_node_ip_address()
        raise UserError(
            f"the model object {source.name!r} cannot be rebuilt on node {host} ({first_line(error)}); make its code "
            "importable there: install it on every node, or call ray.init(address=..., runtime_env={'py_modules': "
            "[your_module]}) before searching, or define the model's class in __main__."
        ) from None

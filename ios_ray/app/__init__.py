"""The application: the floor that joins the scheduler, the profiler (Ray), the store (DuckDB) and the runtime into
what a user calls. Three entrances, each a package, imports pointing down only (``tests/test_layers.py``):

- :mod:`ios_ray.app.search`: ``ios_ray.search`` and ``ios_ray.optimize``: plan, measure what is missing, solve,
  check, write schedules;
- :mod:`ios_ray.app.compile`: ``torch.compile(model, backend="ios_ray")``: each graph Dynamo hands over runs the
  schedule a search made for it (or the store's latencies give), in a CUDA graph where it pays;
- :mod:`ios_ray.app.cli`: the ``ios-ray`` command, a thin shell over the two.

search < compile < cli: the backend may search (``on_miss="search"``), the command line may do either, and nothing
below this floor imports it. The public API is :data:`ios_ray.__all__`; names here are internal unless it lists them.
"""

"""The torch.compile backend: ``torch.compile(model, backend="ios_ray")`` (or ``ios_ray.backend(...)`` with options).

Contract: every graph Dynamo hands over runs a schedule made for its fingerprint, batch size and dtype (one given,
one a search wrote, or the one the store's latencies give within the same memory budget a search keeps), and
computes what the graph computes: a graph it cannot import or schedule runs as Dynamo handed it, with one line
saying why. It never recompiles inside a CUDA graph capture. It may search (``on_miss="search"``) through
:mod:`ios_ray.app.search`, and imports nothing from :mod:`ios_ray.app.cli`.

- :mod:`~ios_ray.app.compile.backend`: the backend and its options;
- :mod:`~ios_ray.app.compile.compiled_graph`: one graph's compiled callable;
- :mod:`~ios_ray.app.compile.graph_schedules`: where a graph's schedule is found.
"""

"""The search: a model, devices and batch sizes in; per (device, batch) the fastest schedule found, checked end to
end, stored and written.

Contract: :func:`~ios_ray.app.search.api.search` checks the request first, in one sentence per mistake, before Ray
or a model starts (:func:`~ios_ray.app.search.request.checked_request`, into a :class:`SearchPlan` with nothing left
to default); it measures each stage at most once per device identity and batch (the store remembers across
processes); every schedule is solved one way (:class:`~ios_ray.app.search.solver.Solver`), within the memory budget;
on a measured device the kept schedule ran whole beside sequential and is never slower beyond noise. It imports
nothing from :mod:`ios_ray.app.compile` or :mod:`ios_ray.app.cli`.

- :mod:`~ios_ray.app.search.api`: ``search``, ``optimize``, ``SearchResult``; :mod:`~ios_ray.app.search.options`:
  their options, written once for Python and the command line;
- :mod:`~ios_ray.app.search.request`: the request checked into a plan; :mod:`~ios_ray.app.search.job`: the steps;
- :mod:`~ios_ray.app.search.measuring`, :mod:`~ios_ray.app.search.rounds`: what to measure next;
  :mod:`~ios_ray.app.search.kernel_choice`: which kernels the stages run;
- :mod:`~ios_ray.app.search.solver`, :mod:`~ios_ray.app.search.budgets`, :mod:`~ios_ray.app.search.candidates`,
  :mod:`~ios_ray.app.search.check`: the schedules, their memory, the candidates and their end-to-end check;
- :mod:`~ios_ray.app.search.outcome`, :mod:`~ios_ray.app.search.progress`, :mod:`~ios_ray.app.search.ray_session`,
  :mod:`~ios_ray.app.search.compiled_search`: what it hands back and says, the Ray it runs on, the search of the
  graphs torch.compile would hand over.
"""

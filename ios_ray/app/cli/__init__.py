"""The ``ios-ray`` command: a thin shell over the Python API, one typer app (:data:`app`).

Contract: every command parses its options, calls the library (:mod:`ios_ray.app.search`, :mod:`ios_ray.runtime`,
the store) and prints; a :class:`~ios_ray.errors.UserError` becomes one line on stderr and exit status 1 (with
``--debug`` its traceback too), Ctrl-C 130 and SIGTERM 143. Nothing below imports this package.

- :mod:`~ios_ray.app.cli.commands`: the app; ``models``, ``inspect``, ``search``, ``show``.
- :mod:`~ios_ray.app.cli.deploy`: ``run``, ``bench``, ``evaluate`` (schedules run on this machine), with
  :mod:`~ios_ray.app.cli.bench` and :mod:`~ios_ray.app.cli.evaluation` behind them.
- :mod:`~ios_ray.app.cli.store`: ``ios-ray store ...``.
- :mod:`~ios_ray.app.cli.show`, :mod:`~ios_ray.app.cli.timeline`, :mod:`~ios_ray.app.cli.plot`: a schedule in text
  and in pictures; :mod:`~ios_ray.app.cli.inspection`: ``inspect``'s report; :mod:`~ios_ray.app.cli.util`: shared
  parsing and the error handling.
"""

from ios_ray.app.cli import deploy  # noqa: F401 - registers run, bench and evaluate on the app
from ios_ray.app.cli.commands import app
from ios_ray.app.cli.store import store_app

app.add_typer(store_app, name="store", help="Read, export and import the latency store.")

__all__ = ["app"]

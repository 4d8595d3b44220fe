"""The ``ios-ray`` command's entry point (the commands live in :mod:`ios_ray.app.cli`)."""

from ios_ray.app.cli import app

__all__ = ["app"]

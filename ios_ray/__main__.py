"""``python -m ios_ray`` runs the ``ios-ray`` command line."""

from ios_ray.cli import app

app(prog_name="ios-ray")

"""The README's code blocks, and running one as a reader would: a Python block as ``python example.py``, a command
in a shell, each in a given folder with this checkout importable (tests/test_readme.py and
tests/test_readme_python.py run them)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from ios_ray.schedule.records import CANDIDATES
from tests.helpers import HANG_S

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
#: The sections whose Python block a test runs (tests/test_readme.py checks that no other has one).
RUN = ("## From Python", "## With torch.compile", "## Deploying: `ScheduledModule`")
#: A search's line saying which schedule a CPU setting kept: any candidate of the check, by its reader's name.
KEPT = re.compile(rf"cpu batch \d+: kept ({'|'.join(map(re.escape, CANDIDATES.values()))}): ")


def blocks(language: str) -> dict[str, list[str]]:
    """The README's code blocks of a language, by the section (``## ...`` heading) they stand in."""
    found: dict[str, list[str]] = {}
    section = ""
    for part in re.split(r"(^## .*$)", README, flags=re.M):
        if part.startswith("## "):
            section = part.strip()
            continue
        found.setdefault(section, []).extend(re.findall(rf"^```{language}\n(.*?)^```$", part, flags=re.S | re.M))
    return {section: code for section, code in found.items() if code}


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A Python block as ``python example.py`` in ``cwd``, with this checkout importable."""
    (cwd / "example.py").write_text(code)
    return subprocess.run([sys.executable, "example.py"], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=HANG_S)


def run_shell(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """One README command (``ios-ray ...`` run by this Python)."""
    argv = shlex.split(line)
    if argv[0] == "ios-ray":
        argv = [sys.executable, "-m", "ios_ray", *argv[1:]]
    return subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=HANG_S)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

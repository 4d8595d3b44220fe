"""Models at the edges of what the import folds and fused kernels run (``tests/edge_models.py``) equal eager (fp32,
relative error <= 1e-5) at batch 1 and 4 under the sequential schedule and the DP's, with eager and fused kernels."""

from __future__ import annotations

import pytest

from tests.edge_models import EDGE_MODELS
from tests.test_idiom_models import Case


@pytest.mark.parametrize("name", list(EDGE_MODELS))
def test_edge_model_equals_eager(name: str) -> None:
    Case(EDGE_MODELS[name]).check_schedules()

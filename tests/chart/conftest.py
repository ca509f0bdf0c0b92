"""Fixtures of the chart tests; the helpers are in chartlib (a unique module name: every tests folder
has a conftest)."""

from __future__ import annotations

import pytest
from chartlib import CI_VALUES, LOCAL_VALUES


@pytest.fixture(params=[*CI_VALUES, LOCAL_VALUES], ids=lambda p: p.name)
def ci_file(request) -> str:
    """Each example values file in charts/baton/ci, and the local cluster's values."""
    return str(request.param)

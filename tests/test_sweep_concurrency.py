"""A sweep file's max_concurrent: the default of --max-concurrent, validated like it (no Ray)."""

from __future__ import annotations

import pytest

from cifar_ray.api import sweep_plan
from cifar_ray.core.errors import ConfigError


def test_a_sweep_files_max_concurrent_reaches_the_plan_and_a_bad_one_is_one_line():
    """The quickstart asks a time question, so it runs one trial at a time (the report would call its time
    comparison unfair otherwise); a file without the key leaves it to the cluster; 0 is refused in one line."""
    assert sweep_plan("sweeps/quickstart.yaml").max_concurrent == 1
    assert sweep_plan({"name": "x", "grid": {"workers": [1, 2]}}).max_concurrent is None
    with pytest.raises(ConfigError, match="max_concurrent") as refused:
        sweep_plan({"name": "x", "grid": {"workers": [1, 2]}, "max_concurrent": 0})
    assert "\n" not in str(refused.value)

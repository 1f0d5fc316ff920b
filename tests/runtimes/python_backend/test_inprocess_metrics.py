"""Custom metrics of an in-process (dict-contract) Python model: made in ``initialize`` and
``execute`` on the model's executor threads, kept by the server's store, a temporary
metric's series gone once collected, everything gone at unload."""

from __future__ import annotations

import numpy as np
import pytest

from runtimes.base import RuntimeOptions
from runtimes.custom_metrics import CustomMetrics
from runtimes.errors import ModelLoadError
from runtimes.python_model import PythonRuntime
from tests.models import load_runtime, write_python_model

pytestmark = pytest.mark.anyio

MODEL = """
import gc

import numpy as np
from runtimes.python_backend import pb_utils


class TritonPythonModel:
    def initialize(self, args):
        family = pb_utils.MetricFamily
        self.rows = family("rows_seen", "Rows seen", family.COUNTER)
        self.counter = self.rows.Metric(labels={"model": args["model_name"]})

    def execute(self, inputs):
        x = inputs["INPUT0"]
        self.counter.increment(len(x))
        # A metric that lives for one call: its series goes once it is collected.
        self.rows.Metric(labels={"model": "temporary"}).increment(1)
        gc.collect()
        return {"OUTPUT0": np.full_like(x, self.counter.value())}
"""


async def test_a_model_counts_into_the_servers_store(tmp_path) -> None:
    store = CustomMetrics()
    runtime = await load_runtime(
        PythonRuntime,
        write_python_model(tmp_path, "counting", MODEL),
        options=RuntimeOptions(custom_metrics=store),
    )
    try:
        await runtime.infer({"INPUT0": np.zeros(3, np.float32)})
        result = await runtime.infer({"INPUT0": np.zeros(2, np.float32)})
        assert result["OUTPUT0"].tolist() == [5.0, 5.0]
        lines = list(store.lines())
        assert 'rows_seen{model="counting"} 5' in lines
        assert not any('model="temporary"' in line for line in lines)
    finally:
        await runtime.unload()
    assert list(store.lines()) == []


async def test_without_a_store_creating_a_family_fails_the_load(tmp_path) -> None:
    with pytest.raises(ModelLoadError, match="custom metrics are not offered"):
        await load_runtime(PythonRuntime, write_python_model(tmp_path, "counting", MODEL))

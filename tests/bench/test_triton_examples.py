"""bench/triton_examples.py against one real ``zeroserve serve``: its repository loads whole
and answers as Triton's test models do (checked here by a stand-in example written with
tritonclient, since Triton's examples are not part of this repository), and an example that
prints FAILED counts as failed even when it exits with 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.triton_examples import MODELS, run_all, table

CHECK_MODELS = f"""
import argparse, sys
import numpy as np
import tritonclient.grpc as grpcclient

parser = argparse.ArgumentParser()
parser.add_argument("-u", "--url")
client = grpcclient.InferenceServerClient(parser.parse_args().url)
for name in {sorted(MODELS)!r}:
    assert client.is_model_ready(name), name
assert len(client.get_model_repository_index().models) == {len(MODELS)}

def infer(model, named, **kwargs):
    inputs = []
    for name, array, datatype in named:
        inputs.append(grpcclient.InferInput(name, array.shape, datatype))
        inputs[-1].set_data_from_numpy(array)
    return client.infer(model, inputs, **kwargs)

a = np.array([[str(v) for v in range(16)]], dtype=object)
b = np.array([["1"] * 16], dtype=object)
out = infer("simple_string", [("INPUT0", a, "BYTES"), ("INPUT1", b, "BYTES")])
assert [int(v) for v in out.as_numpy("OUTPUT0")[0]] == list(range(1, 17))
steps = [(5, True, False), (7, False, False), (9, False, True)]
got = [
    int(infer("simple_sequence", [("INPUT", np.array([[v]], np.int32), "INT32")],
              sequence_id=42, sequence_start=s, sequence_end=e).as_numpy("OUTPUT")[0][0])
    for v, s, e in steps
]
assert got == [6, 7, 9], got
got = [
    int(infer("simple_dyna_sequence", [("INPUT", np.array([[v]], np.int32), "INT32")],
              sequence_id=42, sequence_start=s, sequence_end=e).as_numpy("OUTPUT")[0][0])
    for v, s, e in steps
]
assert got == [6, 7, 51], got
print("PASS: models")
"""


@pytest.mark.integration
def test_repository_serves_and_outcomes_are_read(tmp_path: Path) -> None:
    examples = tmp_path / "examples"
    examples.mkdir()
    (examples / "simple_grpc_infer_client.py").write_text("raise SystemExit(0)\n")
    (examples / "simple_grpc_models_client.py").write_text(CHECK_MODELS)
    (examples / "simple_http_flagged_client.py").write_text("print('FAILED : x')\n")
    (examples / "other_client.py").write_text("raise SystemExit(1)\n")
    work = tmp_path / "work"
    work.mkdir()
    outcomes = {o.example: o for o in run_all(examples, work, timeout_s=120.0)}
    assert sorted(outcomes) == [
        "simple_grpc_infer_client.py",
        "simple_grpc_models_client.py",
        "simple_http_flagged_client.py",
    ]
    models = outcomes["simple_grpc_models_client.py"]
    assert models.passed, models.tail
    assert models.tail.endswith("PASS: models")
    flagged = outcomes["simple_http_flagged_client.py"]
    assert (flagged.passed, flagged.exit_status) == (False, 0)
    assert "2 of 3 passed" in table(list(outcomes.values()))

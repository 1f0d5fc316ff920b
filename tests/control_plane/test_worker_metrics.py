"""``merge_families``: the workers' pages joined into one valid exposition, each family once,
every sample labelled with its worker."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from control_plane.worker_metrics import merge_families

# The shapes a worker's page has: Triton's counters without _total, a gauge with no labels,
# a histogram (vLLM's names have colons), and families that are not passed through.
_PAGE = """\
# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="%(model)s",version="1"} %(count)d
# HELP nv_cache_num_entries Number of responses stored in response cache
# TYPE nv_cache_num_entries gauge
nv_cache_num_entries %(count)d
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="%(model)s"} 1.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="%(model)s"} %(count)d.0
vllm:time_to_first_token_seconds_count{model_name="%(model)s"} %(count)d.0
vllm:time_to_first_token_seconds_sum{model_name="%(model)s"} 0.05
# HELP zeroserve_model_state Whether a model version is in a state
# TYPE zeroserve_model_state gauge
zeroserve_model_state{model="%(model)s",state="ready",version="1"} 1
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 1.5
"""


def _page(model: str, count: int) -> str:
    return _PAGE % {"model": model, "count": count}


def test_each_family_once_with_every_workers_samples_labelled() -> None:
    text = merge_families([("w-1", _page("a", 3)), ("w-2", _page("b", 5))], ("nv_", "vllm:"))

    families = {family.name: family for family in text_string_to_metric_families(text)}
    # The parser gives counters without _total a _total sample name; the family name stays.
    assert set(families) == {
        "nv_inference_request_success",
        "nv_cache_num_entries",
        "vllm:time_to_first_token_seconds",
    }
    for line in (
        "# TYPE nv_inference_request_success counter",
        "# TYPE nv_cache_num_entries gauge",
    ):
        assert text.count(line) == 1
    success = {
        (s.labels["worker"], s.labels["model"]): s.value
        for s in families["nv_inference_request_success"].samples
    }
    assert success == {("w-1", "a"): 3, ("w-2", "b"): 5}
    entries = {s.labels["worker"]: s.value for s in families["nv_cache_num_entries"].samples}
    assert entries == {"w-1": 3, "w-2": 5}
    counts = {
        s.labels["worker"]: s.value
        for s in families["vllm:time_to_first_token_seconds"].samples
        if s.name.endswith("_count")
    }
    assert counts == {"w-1": 3, "w-2": 5}
    # Triton's name is kept exactly (no _total added on the way through).
    assert 'nv_inference_request_success{worker="w-1",model="a",version="1"} 3' in text


def test_families_the_platform_names_itself_are_left_out() -> None:
    pages = [("w-1", _page("a", 3))]
    both = merge_families(pages, ("nv_", "zeroserve_"))
    assert "zeroserve_model_state{" in both
    text = merge_families(pages, ("nv_", "zeroserve_"), exclude={"zeroserve_model_state"})
    assert "zeroserve_model_state" not in text
    assert "nv_inference_request_success{" in text


def test_no_pages_and_odd_worker_ids() -> None:
    assert merge_families([], ("nv_",)) == ""
    text = merge_families([('w"\\x', _page("a", 1))], ("nv_",))
    [sample] = [
        s
        for family in text_string_to_metric_families(text)
        if family.name == "nv_inference_request_success"
        for s in family.samples
    ]
    assert sample.labels["worker"] == 'w"\\x'

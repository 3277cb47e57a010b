import pytest

from toolkit.bench.metrics import Slo, calculate_metrics, distribution, phase_split
from toolkit.bench.records import RecordWriter, RequestRecord, read_records


def record(index, send, chunks, tokens=None, **kw):
    return RequestRecord(index, "s", send, 10, len(chunks), chunk_times=list(chunks), end_time=chunks[-1] + 0.001,
                         output_tokens=tokens if tokens is not None else len(chunks), **kw)


def test_record_metric_definitions():
    r = record(0, 10.0, [10.1, 10.12, 10.14, 10.16, 10.18])
    assert r.ttft == pytest.approx(0.1)
    assert r.e2e_latency == pytest.approx(0.18)
    # ITL = (latency − TTFT) / (output tokens − 1) = 0.08 / 4
    assert r.inter_token_latency == pytest.approx(0.02)
    assert r.chunk_gaps == pytest.approx([0.02] * 4)


def test_itl_uses_token_count_not_chunk_count():
    # 3 chunks carrying 9 tokens (an OpenAI server may batch tokens per chunk)
    r = record(0, 0.0, [0.5, 0.7, 0.9], tokens=9)
    assert r.inter_token_latency == pytest.approx(0.4 / 8)


def test_single_token_has_no_itl():
    assert record(0, 0.0, [0.2]).inter_token_latency is None


def test_calculate_metrics_on_hand_made_timestamps():
    records = [
        record(0, 0.0, [0.1, 0.2, 0.3]),  # ttft 100 ms, itl 100 ms, latency 300 ms
        record(1, 0.0, [0.3, 0.35, 0.4]),  # ttft 300 ms, itl 50 ms, latency 400 ms
        record(2, 0.0, [0.05, 0.06, 0.07], warmup=True),  # excluded
        RequestRecord(3, "s", 0.1, 10, 3, error="boom", error_kind="server_error"),
    ]
    s = calculate_metrics(records)
    m = s["metrics"]
    assert s["request_count"] == 2 and s["error_count"] == 1 and s["errors_by_kind"] == {"server_error": 1}
    assert m["time_to_first_token"]["avg"] == pytest.approx(200)
    assert m["time_to_first_token"]["min"] == pytest.approx(100)
    assert m["time_to_first_token"]["p50"] == pytest.approx(200)
    assert m["inter_token_latency"]["avg"] == pytest.approx(75)
    assert m["request_latency"]["max"] == pytest.approx(400)
    assert m["inter_chunk_gap"]["max"] == pytest.approx(100)
    assert m["time_to_second_token"]["avg"] == pytest.approx(75)
    # window: first send 0.0 → last completion 0.401 (the failed request has no end)
    assert s["duration_s"] == pytest.approx(0.401)
    assert s["output_token_throughput"]["avg"] == pytest.approx(6 / 0.401)
    assert s["request_throughput"]["avg"] == pytest.approx(2 / 0.401)
    assert m["output_token_throughput_per_user"]["avg"] == pytest.approx((10 + 20) / 2)


def test_percentiles_interpolate_like_numpy():
    d = distribution([float(v) for v in range(1, 101)])
    assert d["p50"] == pytest.approx(50.5)
    assert d["p99"] == pytest.approx(99.01)
    assert d["p1"] == pytest.approx(1.99)
    assert distribution([]) is None


def test_goodput_counts_requests_within_slo():
    records = [record(0, 0.0, [0.1, 0.2, 0.3]), record(1, 0.0, [0.3, 0.35, 0.4])]
    s = calculate_metrics(records, Slo(ttft_ms=200))
    assert s["goodput"]["good_requests"] == 1
    s = calculate_metrics(records, Slo(ttft_ms=500, itl_ms=60))
    assert s["goodput"]["good_requests"] == 1


def test_phase_split_names_dominant_phase():
    s = calculate_metrics([record(0, 0.0, [0.1, 0.2, 0.3])])
    p = phase_split(s)
    assert p["prefill_ms"] == pytest.approx(100) and p["decode_ms"] == pytest.approx(200)
    assert p["dominant"] == "decode" and p["prefill_share"] == pytest.approx(1 / 3)


def test_records_roundtrip_and_survive_truncated_line(tmp_path):
    path = tmp_path / "records.jsonl"
    writer = RecordWriter(path)
    writer.write(record(0, 0.0, [0.1, 0.2]))
    writer.write(record(1, 0.0, [0.3, 0.4]))
    writer.close()
    with path.open("a") as f:
        f.write('{"request_index": 2, "st')  # a crash mid-write
    back = read_records(path)
    assert [r.request_index for r in back] == [0, 1]
    assert back[1].ttft == pytest.approx(0.3)

"""Reports from run folders built of real-shaped records: labels, precision in titles, plot conventions
(one load axis per mode, log-2 concurrency ticks, a Pareto frontier per ISL/OSL), and an HTML page
that holds every section of the Markdown."""

import json
from pathlib import Path

import pytest

from toolkit.bench.metrics import calculate_metrics, phase_split
from toolkit.bench.records import RecordWriter, RequestRecord
from toolkit.bench.rundir import RunDir
from toolkit.report import plots
from toolkit.report.html import render_html
from toolkit.report.markdown import COLUMNS, precision, render_markdown, run_header, run_labels, sections


def _records(step: str, level: int, n: int, t0: float, ttft: float, itl: float) -> list[RequestRecord]:
    out = []
    for i in range(n):
        send = t0 + i * 0.05
        chunks = [send + ttft * (1 + 0.1 * (i % 3))]
        for _ in range(7):
            chunks.append(chunks[-1] + itl)
        out.append(RequestRecord(i, step, send, 32, 8, chunk_times=chunks, end_time=chunks[-1], output_tokens=8,
                                 server_output_tokens=8))
    return out


def make_run(root: Path, name: str, mode="concurrency", levels=(1, 2, 4), isl=32, info=None, n=8) -> Path:
    """A run folder as `toolkit sweep` writes it: records, server-metric samples, engine steps, summary."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    writer = RecordWriter(run_dir / "records.jsonl")
    steps, samples, engine, t = [], [], [], 100.0
    for level in levels:
        step = f"concurrency_{level}" if mode == "concurrency" else f"rate_{level:g}"
        records = _records(step, level, n, t, ttft=0.01 * level, itl=0.002 * level)
        for r in records:
            writer.write(r)
        summary = {"step": step, "mode": mode, mode: level, "input_tokens": isl, "output_tokens": 8,
                   **calculate_metrics(records)}
        if mode == "concurrency":
            summary["concurrency"] = level
        summary["phases"] = phase_split(summary)
        steps.append(summary)
        for k in range(3):
            samples.append({"time": t + 0.2 * k, "wall": t + 0.2 * k + 1.7e9, "step": step,
                            "metrics": {'toolkit_kv_cache_blocks_used{model="tensorrt_llm"}': float(k * level)}})
            engine.append({"step": len(engine), "start": t + 1.7e9, "mono": t + 0.2 * k, "duration": 0.004,
                           "forward": 0.003, "batch_size": level, "context_requests": 1, "generation_requests": level,
                           "prefill_tokens": isl, "decode_tokens": level, "draft_tokens": 0, "accepted_tokens": 0,
                           "kv_blocks_used": 2 * level, "kv_blocks_max": 128, "waiting": 0, "preempted": 0})
        t += 2.0
    writer.close()
    (run_dir / "server_metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (run_dir / "engine_timeline.jsonl").write_text("".join(json.dumps(s) + "\n" for s in engine))
    run_info = {"config_name": "cpu-tiny", "model": "tiny", "qformat": "fp8", "kv_cache_dtype": "none",
                "target": "cpu", "endpoint": "triton-grpc", "plan": {"gpu": "cpu"},
                "plan_deployment": {"tp": 1, "pp": 1, "weights": "fp32"},
                "sweep": {"mode": mode, "concurrencies": list(levels), "requests_per_step": n}} | (info or {})
    (run_dir / "summary.json").write_text(json.dumps({"run": run_info, "steps": steps, "complete": True}))
    return run_dir


def test_labels_are_distinct_and_say_what_differs(tmp_path):
    a = RunDir.open(make_run(tmp_path, "20261123-101500-cpu-tiny"))
    b = RunDir.open(make_run(tmp_path, "20261123-103000-cpu-tiny", info={"qformat": "int4_awq"}))
    c = RunDir.open(make_run(tmp_path, "20261123-104500-cpu-tiny", mode="rate", levels=(2, 4)))
    labels = run_labels([a, b, c])
    assert len(set(labels)) == 3
    assert "fp8" in labels[0] and "int4_awq" in labels[1]  # what differs
    assert "10:15:00" in labels[0] and "rate" in labels[2]  # date/time and load mode
    reps = [RunDir.open(make_run(tmp_path, f"20261123-11000{i}-cpu-tiny-{i}", info={"label": "fp8", "repetition": i}))
            for i in range(2)]
    rep_labels = run_labels(reps)
    assert rep_labels[0].startswith("fp8") and "rep 1" in rep_labels[0] and "rep 2" in rep_labels[1]


def test_the_header_says_what_the_cpu_engine_ran(tmp_path):
    """The served engine's own account (its build's vector ISA, kernels, threads) heads the report; runs without it
    (GPU targets, older runs) say nothing of it."""
    served = {"step_kernels": "fused C on AVX2 + FMA (norms, RoPE, SwiGLU, paged attention, few-row GEMMs)",
              "threads": 2, "compute_dtype": "bfloat16"}
    run = RunDir.open(make_run(tmp_path, "avx2", info={"served_engine": served}))
    assert "- engine: fused C on AVX2 + FMA (norms, RoPE, SwiGLU, paged attention, few-row GEMMs), 2 threads" in \
        render_markdown([run]).splitlines()
    assert not any(line.startswith("- engine:") for line in render_markdown([RunDir.open(make_run(tmp_path, "gpu"))])
                   .splitlines())
    bound = {**served, "threads": 16, "cpu_binding": "16 threads on NUMA node 1 of 2, CPUs 16-31,48-63"}
    assert "- engine: fused C on AVX2 + FMA (norms, RoPE, SwiGLU, paged attention, few-row GEMMs), 16 threads on " \
        "NUMA node 1 of 2, CPUs 16-31,48-63" in render_markdown([RunDir.open(make_run(tmp_path, "numa",
                                                                        info={"served_engine": bound}))]).splitlines()


def test_titles_never_call_an_fp32_computed_model_fp8(tmp_path):
    cpu = RunDir.open(make_run(tmp_path, "cpu"))
    assert precision(cpu) == "fp8 checkpoint, computed in fp32"
    assert "fp8 checkpoint, computed in fp32" in render_markdown([cpu]).splitlines()[0]
    native = RunDir.open(make_run(tmp_path, "native", info={"weight_format": "fp8-a8"}))
    assert precision(native) == "fp8"
    widened = RunDir.open(make_run(tmp_path, "widened", info={"weight_format": "fp8-widened"}))
    assert precision(widened) == "fp8 checkpoint, engine kernels fp8-widened"
    served = RunDir.open(make_run(tmp_path, "served", info={"weight_format": "fp8-widened",
                                                            "served_engine": {"compute_dtype": "bf16"}}))
    assert precision(served) == "fp8 checkpoint, computed in bf16 (fp8-widened kernels)"
    # fp8 re-quantized for the int8 x int8 kernel (a CPU without AVX512-BF16): integer GEMMs, not bf16 ones
    as_int8 = RunDir.open(make_run(tmp_path, "as-int8", info={"weight_format": "int8(fp8)-a8-int8act",
                                                              "served_engine": {"compute_dtype": "bfloat16"}}))
    assert precision(as_int8) == "fp8 checkpoint on int8(fp8)-a8-int8act kernels"
    # The CPU runtime plans fp8 bytes but, unreported, is said to compute in its activation dtype
    runtime = RunDir.open(make_run(tmp_path, "runtime", info={"plan_deployment": {"weights": "fp8"},
                                                              "engine": {"dtype": "auto"}}))
    assert precision(runtime) == "fp8 checkpoint, computed in bf16"
    awq = RunDir.open(make_run(tmp_path, "awq", info={"qformat": "int4_awq", "weight_format": "int4-g128"}))
    assert precision(awq) == "int4_awq"
    gpu = RunDir.open(make_run(tmp_path, "gpu", info={"target": "trtllm", "plan_deployment": {"weights": "fp8"}}))
    assert precision(gpu) == "fp8"


def test_rate_and_concurrency_never_share_a_load_axis(tmp_path):
    runs = [RunDir.open(make_run(tmp_path, "c")), RunDir.open(make_run(tmp_path, "r", mode="rate", levels=(2, 4)))]
    alts = [alt for alt, _ in plots.comparison_plots(runs, run_labels(runs))]
    assert alts == ["TTFT vs concurrency", "ITL vs concurrency", "TTFT vs rate", "ITL vs rate",
                    "throughput vs interactivity"]
    # A mode with no steps in a run draws nothing for that run; a mode no run has draws no plot at all
    assert plots.latency_vs_load(runs[:1], ["c"], "time_to_first_token", "TTFT", "rate") is None
    for _, make in plots.comparison_plots(runs, run_labels(runs)):
        assert make().startswith(b"\x89PNG")


def test_concurrency_axis_is_log2_with_the_measured_levels_as_ticks():
    plt, fig, ax = plots._figure()
    ax.plot([1, 2, 4, 16], [1, 2, 3, 4])
    plots.log2_levels(ax, [1, 2, 4, 16, 4])
    assert ax.get_xscale() == "log"
    assert list(ax.get_xticks()) == [1, 2, 4, 16]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "16"]
    plt.close(fig)


def test_pareto_frontier_is_per_input_output_shape(tmp_path):
    assert plots.pareto_front([(1, 10), (2, 8), (1.5, 5), (3, 1), (2, 9)]) == [(1, 10), (2, 9), (3, 1)]
    runs = [RunDir.open(make_run(tmp_path, "short", isl=32)), RunDir.open(make_run(tmp_path, "long", isl=512))]
    groups = plots.interactivity_points(runs)
    assert set(groups) == {(32, 8), (512, 8)}  # never one frontier across shapes
    assert all(len(points) == 3 for points in groups.values())
    # x is tokens/s per user (1 / ITL at p50), y is tokens/s per replica on the CPU target
    step = runs[0].steps[0]
    assert groups[(32, 8)][0] == (pytest.approx(step["metrics"]["output_token_throughput_per_user"]["p50"]),
                                  pytest.approx(step["output_token_throughput"]["avg"]))


def test_throughput_is_per_gpu_on_a_gpu_target(tmp_path):
    gpu = RunDir.open(make_run(tmp_path, "gpu", info={"target": "trtllm", "plan": {"gpu": "h100-sxm"},
                                                      "plan_deployment": {"tp": 2, "pp": 1, "weights": "fp8"}}))
    assert plots.replicas_unit(gpu) == (2, "GPU")
    y = plots.interactivity_points([gpu])[(32, 8)][0][1]
    assert y == pytest.approx(gpu.steps[0]["output_token_throughput"]["avg"] / 2)


def test_step_boundaries_come_from_the_records(tmp_path):
    run = RunDir.open(make_run(tmp_path, "run"))
    spans = plots.step_spans(run)
    assert [s[0] for s in spans] == ["c1", "c2", "c4"]
    assert spans[0][1] == pytest.approx(100.0) and spans[1][1] == pytest.approx(102.0)
    assert all(start < end for _, start, end in spans)
    assert plots.server_timeline(run, "x").startswith(b"\x89PNG")
    assert plots.engine_timeline(run, "x").startswith(b"\x89PNG")
    (run.path / "engine_timeline.jsonl").unlink()
    run = RunDir.open(run.path)  # a RunDir reads each file once
    assert plots.engine_timeline(run, "x") is None  # no engine steps fetched: no plot, no error


def test_itl_distribution_plots_per_request_itl(tmp_path):
    run = RunDir.open(make_run(tmp_path, "run"))
    alts = [alt for alt, _ in plots.run_plots(run, "x")]
    assert "ITL distribution" in alts and "inter-chunk gap distribution" in alts
    assert plots.distribution(run, "x", plots.InterTokenLatency(), "ITL per request").startswith(b"\x89PNG")


def test_ecdf_axis_ends_past_the_tail_only_where_a_few_values_lie_far_beyond_it():
    gaps = [5.0 + (i % 10) for i in range(199)]  # 5-14 ms
    assert plots.ecdf_x_limit(gaps) is None  # nothing far out: every value shown
    assert plots.ecdf_x_limit(gaps + [40.0]) is None  # 40 ms is under 3x the 99th percentile (14 ms)
    limit, beyond = plots.ecdf_x_limit(gaps + [700.0])
    assert limit == pytest.approx(1.2 * 14.0) and beyond == 1
    assert plots.ecdf_x_limit([1.0] * 10 + [700.0]) is None  # too few values to call anything a tail
    assert plots.ecdf_x_limit([0.0] * 100 + [5.0]) is None  # a tail quantile of 0 (gaps of coalesced chunks)


def test_html_holds_every_markdown_section_in_order(tmp_path):
    runs = [RunDir.open(make_run(tmp_path, "20261123-101500-a")), RunDir.open(make_run(tmp_path, "20261123-103000-b"))]
    ab = {"results": [{"metric": "time_to_first_token", "step": "concurrency_1", "baseline": "a", "candidate": "b",
                       "baseline_value": 10.0, "candidate_value": 8.0, "relative_change": -0.2, "ci_low": -0.25,
                       "ci_high": -0.15, "verdict": "better", "reason": "every repetition agrees"}]}
    markdown, page = render_markdown(runs, ab), render_html(runs, ab)
    at_md = at_html = 0
    for section in sections(runs, ab):  # each section, in the same order on both pages
        at_md = markdown.index(f"{'#' * section.level} {section.title}\n", at_md) + 1
        at_html = page.index(f">{section.title}</h{section.level}>", at_html) + 1
    assert page.index(">Summary</h2>") < page.index(">A/B verdicts</h2>") < page.index(">Prefill vs decode</h3>")
    assert "10.00 ms" in page and "8.00 ms" in page and "<b>better</b>" in page  # verdicts with units
    assert "Decode dominates end-to-end latency" in page  # the doctor's findings
    assert page.count("<img") >= 10
    for column in ("std", "p1", "p5", "p99"):
        assert column in COLUMNS and f"<th style='text-align:right'>{column}</th>" in page
    assert "<td style='text-align:left'>every repetition agrees</td>" in page  # words left, numbers right


def test_report_and_html_are_written_beside_an_ab_json(tmp_path):
    from toolkit.bench.exports import write_exports
    from toolkit.pipeline import report

    run = make_run(tmp_path, "20261123-101500-a")
    write_exports(run)
    out = tmp_path / "ab"
    out.mkdir()
    (out / "ab.json").write_text(json.dumps({"results": []}))
    path = report(run, out=out / "report.md")
    assert "## A/B verdicts" in path.read_text() and "A/B verdicts" in path.with_suffix(".html").read_text()


def test_small_samples_are_flagged(tmp_path):
    run = RunDir.open(make_run(tmp_path, "run", n=5))
    assert run.steps[0]["small_sample"]
    assert "Only 5 requests" in render_markdown([run])


def test_run_header_says_an_unquantized_kv_cache_is_one_not_none(tmp_path):
    """The config's kv_cache_dtype "none" means a cache left in the activations' dtype, not no cache."""
    for kv, expected in (("none", "- kv cache dtype: `none` (unquantized: the activations' dtype)"),
                         ("fp8", "- kv cache dtype: `fp8`")):
        (tmp_path / "summary.json").write_text(json.dumps({"run": {"model": "small", "kv_cache_dtype": kv},
                                                           "steps": []}))
        assert expected in run_header(RunDir.open(tmp_path))


def test_run_header_says_when_the_client_ran_in_another_session_than_the_server(tmp_path):
    split = {"client": "/autogroup-476", "server": "/autogroup-561"}
    for info, shown in (({"model": "small"}, False), ({"model": "small", "host_scheduling": split}, True)):
        (tmp_path / "summary.json").write_text(json.dumps({"run": info, "steps": []}))
        lines = [line for line in run_header(RunDir.open(tmp_path)) if line.startswith("- client:")]
        assert bool(lines) == shown
    assert "`/autogroup-476` / `/autogroup-561`" in lines[0]


@pytest.mark.parametrize("lines,below", [(6, False), (12, True)])
def test_a_long_legend_goes_below_the_axes_and_the_figure_grows_to_hold_it(lines, below):
    """An A/B of 3 + 3 repetitions draws 12 latency lines: a legend that long inside the axes covers them."""
    plt, fig, ax = plots._figure()
    for i in range(lines):
        ax.plot([1, 4], [i, i + 1], label=f"run {i}")
    plots._legend(ax, fig)
    legend = ax.get_legend()
    assert len(legend.get_texts()) == lines
    fig.canvas.draw()
    legend_box, axes_box = legend.get_window_extent(), ax.get_window_extent()
    assert (legend_box.y1 <= axes_box.y0) == below  # wholly under the axes, or inside them
    assert fig.get_figheight() == pytest.approx(4.0 + 0.18 * lines / 2 if below else 4.0)
    plt.close(fig)

"""One self-contained HTML report (plots embedded as PNG data) of one or several runs."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from toolkit.report import plots
from toolkit.report.markdown import DEFINITIONS, comparison_table, run_header, step_table, step_title
from toolkit.bench.rundir import RunDir

_STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}
td:first-child,th:first-child{text-align:left}img{max-width:100%;border:1px solid #eee;margin:.3em 0}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:10px}.note{background:#fff4e0;padding:.5em 1em}
code{background:#f3f3f3;padding:0 3px}"""


def _img(png: bytes | None, alt: str) -> str:
    if not png:
        return ""
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _markdown_table(text: str) -> str:
    """The report's simple Markdown (pipe tables, bullets, bold) to HTML."""
    out, rows = [], []

    def flush():
        if rows:
            head, body = rows[0], rows[2:]
            out.append("<table><tr>" + "".join(f"<th>{c}</th>" for c in head) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in body) + "</table>")
            rows.clear()

    for line in text.splitlines():
        if line.startswith("|"):
            rows.append([_inline(c.strip()) for c in line.strip("|").split("|")])
            continue
        flush()
        if line.startswith("- "):
            out.append(f"<li>{_inline(line[2:])}</li>")
        elif line.startswith("> "):
            out.append(f'<p class="note">{_inline(line[2:])}</p>')
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    flush()
    return "\n".join(out)


def _inline(text: str) -> str:
    import re

    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def render_html(runs: list[RunDir]) -> str:
    title = runs[0].name if len(runs) == 1 else f"{len(runs)} runs compared"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>Sweep report: {html.escape(title)}</h1>",
             f"<p>{_inline(DEFINITIONS)}</p>"]
    if len(runs) > 1:
        parts += ["<h2>Comparison</h2>", _markdown_table(comparison_table(runs))]
    parts += ["<h2>Latency and throughput vs load</h2><div class='grid'>",
              _img(plots.latency_vs_load(runs, "time_to_first_token", "TTFT"), "TTFT vs load"),
              _img(plots.latency_vs_load(runs, "inter_token_latency", "ITL"), "ITL vs load"),
              _img(plots.throughput_vs_latency(runs), "throughput vs latency"), "</div>"]
    for run in runs:
        parts += [f"<h2>Run {html.escape(run.label)} <small>({html.escape(run.name)})</small></h2>",
                  _markdown_table("\n".join(run_header(run))), "<div class='grid'>",
                  _img(plots.phase_shares(run), "prefill vs decode"),
                  _img(plots.itl_distribution(run), "ITL distribution"),
                  _img(plots.server_timeline(run), "server over time"),
                  _img(plots.roofline_with_measurements(run), "roofline with measured points"), "</div>"]
        for step in run.steps:
            parts += [f"<h3>{html.escape(step_title(step))}</h3>", _markdown_table(step_table(step))]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html_report(runs: list[RunDir], path: Path) -> Path:
    path.write_text(render_html(runs))
    return path

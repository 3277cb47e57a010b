"""One self-contained HTML report (plots embedded as PNG data) of one or several runs: the same
sections as report.md (toolkit/report/markdown.py), each followed by its plots."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from toolkit.bench.rundir import RunDir
from toolkit.report.markdown import load_ab, report_title, sections

_STYLE = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0;font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}
td:first-child,th:first-child{text-align:left}th{background:#f5f5f5}img{max-width:100%;border:1px solid #eee;margin:.3em 0}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:10px}.note{background:#fff4e0;padding:.5em 1em}
code{background:#f3f3f3;padding:0 3px}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}"""


def _img(png: bytes | None, alt: str) -> str:
    if not png:
        return ""
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def markdown_to_html(text: str) -> str:
    """The report's own Markdown (pipe tables, bullets, quotes, bold, code) to HTML."""
    out, rows, items = [], [], []

    def flush():
        if rows:
            head, body = rows[0], rows[2:]
            # Markdown's own alignment row: ---: right (numbers), --- left (words)
            align = ["right" if c.endswith(":") else "left" for c in rows[1]]
            out.append("<table><tr>" + "".join(f"<th style='text-align:{a}'>{c}</th>" for c, a in zip(head, align))
                       + "</tr>" + "".join("<tr>" + "".join(f"<td style='text-align:{a}'>{c}</td>"
                                                              for c, a in zip(r, align)) + "</tr>" for r in body)
                       + "</table>")
            rows.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>")
            items.clear()

    for line in text.splitlines():
        if line.startswith("|"):
            rows.append([_inline(c.strip()) for c in line.strip().strip("|").split("|")])
            continue
        if line.startswith("- "):
            items.append(_inline(line[2:]))
            continue
        if line.startswith("  - ") and items:
            items[-1] += "<br>" + _inline(line[4:])
            continue
        flush()
        if line.startswith("> "):
            out.append(f'<p class="note">{_inline(line[2:])}</p>')
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    flush()
    return "\n".join(out)


def _inline(text: str) -> str:
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def render_html(runs: list[RunDir], ab: dict | None = None) -> str:
    title = report_title(runs)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>Sweep report: {html.escape(title)}</h1>"]
    for section in sections(runs, ab):
        parts += [f"<h{section.level}>{html.escape(section.title)}</h{section.level}>", markdown_to_html(section.body)]
        images = [_img(make(), alt) for alt, make in section.plots]
        images = [i for i in images if i]
        if images:
            parts += ["<div class='grid'>", *images, "</div>"]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html_report(runs: list[RunDir], path: Path) -> Path:
    path.write_text(render_html(runs, load_ab(path.parent)))
    return path

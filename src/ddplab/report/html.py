"""index.html: the whole report in one file that opens anywhere, offline, and can be mailed.

Nothing is fetched: plots are embedded as base64 data URIs, the style is inline, and there
is no script. Every piece of text from the runs goes through `html.escape`.
"""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path
from typing import Any

from ddplab.errors import file_error

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1200px;
       padding: 0 1rem; color: #1d1d1f; line-height: 1.45; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.2rem; margin-top: 2rem; border-bottom: 1px solid #ddd; }
.meta, .note { color: #555; font-size: 0.9rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.85rem; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.5rem; text-align: right; white-space: nowrap; }
th { background: #f4f4f6; } td:first-child, th:first-child { text-align: left; }
tr:nth-child(even) td { background: #fafafa; }
figure { margin: 1.5rem 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9rem; }
li.problem { color: #8a1c1c; }
"""

CAPTIONS = {
    "loss_curves": "Train and test loss per epoch, mean over seeds (shaded: ± std).",
    "accuracy_curves": "Train and test accuracy per epoch, mean over seeds (shaded: ± std).",
    "step_loss": "Training loss per recorded step (steps.jsonl).",
    "batch_size": "Time per epoch and peak memory per rank against the local batch size.",
    "accuracy_vs_time": "Final test accuracy against total run time (error bars: ± std over seeds).",
    "throughput": "Training images/s against world size; dotted: linear scaling from 1 worker.",
    "time_breakdown": "Where training time went; communication wait shown apart from forward+backward.",
    "gpu_utilization": "GPU utilization sampled during training (gpu.jsonl).",
}


def table_html(headers: list[str], cells: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in cells)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def image_html(name: str, path: Path) -> str:
    """A PNG inlined as a data URI, so the page needs no other file."""
    try:
        data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    except OSError as exc:
        raise file_error(exc, "read") from None
    caption = CAPTIONS.get(name, name.replace("_", " "))
    return (f'<figure><img alt="{escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{escape(caption)}</figcaption></figure>")


def page(title: str, meta: str, findings: list[str], tables: list[tuple[str, str, tuple[list[str], list[list[str]]]]],
         plots: dict[str, Path], problems: list[dict[str, Any]]) -> str:
    """The full page; `tables` are (heading, note, (headers, cells)) in display order."""
    parts = [f"<h1>{escape(title)}</h1>", f'<p class="meta">{escape(meta)}</p>', "<h2>Findings</h2>",
             "<ul>" + "".join(f"<li>{escape(f)}</li>" for f in findings) + "</ul>"]
    for heading, note, (headers, cells) in tables:
        parts += [f"<h2>{escape(heading)}</h2>", table_html(headers, cells) if cells else "<p>none</p>"]
        if note:
            parts.append(f'<p class="note">{escape(note)}</p>')
    parts.append("<h2>Plots</h2>")
    parts += [image_html(name, path) for name, path in plots.items()]
    if "gpu_utilization" not in plots:
        parts.append('<p class="note">GPU utilization: not measured (no run wrote gpu.jsonl).</p>')
    parts.append("<h2>Runs that did not finish</h2>")
    if problems:
        parts.append("<ul>" + "".join(
            f'<li class="problem"><b>{escape(p["run"])}</b> ({escape(p["status"])}): '
            f'{escape(p["error"] or "no error recorded")}<br><span class="note">{escape(p["dir"])}</span></li>'
            for p in problems) + "</ul>")
    else:
        parts.append("<p>none: every run finished.</p>")
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{escape(title)}</title>\n'
            f"<style>{STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n")

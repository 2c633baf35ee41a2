"""index.html and report.md: the sections, each a question with its answer, tables and plots.

index.html opens anywhere, offline, and can be mailed: plots are embedded as base64 data
URIs, the style is inline, and there is no script. Every piece of text from the runs goes
through `html.escape` (HTML) or `md_text` (Markdown). The main tables fit a 1200-pixel page
without a horizontal scroll bar; the wide clock table sits in a closed <details>.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from ddplab.errors import file_error
from ddplab.report.plots import Plot
from ddplab.report.records import Row

Table = tuple[str, str, tuple[list[str], list[list[str]]]]  # (heading, note, (headers, cells))
TEXT_COLUMNS = {
    "point",
    "run",
    "vs",
    "timing verdict",
    "accuracy verdict",
    "other load",
    "early stop (patience 2) after",
}

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1200px;
       padding: 0 1rem; color: #1d1d1f; line-height: 1.45; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.3rem; margin-top: 2.5rem; border-bottom: 2px solid #ccd; }
h3 { font-size: 1.05rem; margin: 1.2rem 0 0.4rem; }
.meta, .note, .source { color: #555; font-size: 0.9rem; }
blockquote { margin: 0.6rem 0; padding: 0.4rem 0.9rem; border-left: 4px solid #99b; background: #f6f6fb; }
ul.findings li { margin: 0.3rem 0; }
li.unreliable { color: #8a4b00; } li.check { color: #8a1c1c; } li.missing { color: #666; }
li.unreliable::before { content: "unreliable: "; font-weight: 600; }
li.check::before { content: "check: "; font-weight: 600; }
.setup { background: #f4f4f6; padding: 0.4rem 0.7rem; font-size: 0.9rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.82rem; margin: 0.3rem 0 0.8rem; }
th, td { border: 1px solid #ddd; padding: 0.2rem 0.45rem; text-align: right; white-space: nowrap; }
th { background: #f4f4f6; white-space: normal; }
td.text, th.text { text-align: left; white-space: normal; max-width: 24em; }
tr:nth-child(even) td { background: #fafafa; }
figure { margin: 1rem 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9rem; }
li.problem { color: #8a1c1c; }
details { margin: 0.6rem 0; } summary { cursor: pointer; color: #335; }
code { font-size: 0.85rem; }
nav.answers h2 { margin-top: 1rem; } nav.answers li { margin: 0.2rem 0; }
p.headline { font-weight: 600; margin: 0.3rem 0; }
"""

READING = [
    (
        "Training throughput",
        "training images per second of training time, epochs after the first (it warms caches); "
        "evaluation is left out, since the settings compared do not change it.",
    ),
    (
        "Speedup",
        "a point's training throughput over its baseline's. Efficiency: speedup over the ideal, the devices it "
        "adds (GPUs; on a CPU the processes of one machine share its cores, so their ideal is 1x).",
    ),
    (
        "Noise of a timing",
        "the spread of the runs' throughputs over seeds (never less than a run's own spread). A "
        "difference is an effect only beyond 2 noises and 3%. With one run per side the verdict is 'single run': "
        "separate runs on one machine can differ by more than either run's own spread, so one run each cannot tell.",
    ),
    (
        "Unreliable",
        "a run competed with other work while it trained (other processes used 10% of the CPUs, the "
        "hypervisor took 5%, or another process shared its GPU): its clock measured the load, not the setting.",
    ),
    (
        "Accuracy noise",
        "the larger of the standard deviation over seeds and the test set's own sampling noise "
        "(sqrt(p(1-p)/n)); a difference within 2 noises is not an effect. With one seed, a difference beyond the "
        "sampling noise is 'single seed': the spread over seeds, usually larger, is not measured.",
    ),
    (
        "Train-test gap",
        "train accuracy on training images measured as the test set is (eval mode, no augmentation) "
        "minus test accuracy; the running train accuracy over augmented batches with dropout is not comparable.",
    ),
]


@dataclass
class SectionView:
    """What one section shows, ready to render."""

    title: str
    source: str
    question: str
    note: str
    setup: str
    architecture: str | None
    findings: list[Any]  # Finding (text, flag)
    tables: list[Table]
    details: list[Table]
    plots: list[Plot]
    not_measured: list[tuple[str, str]]
    problems: list[Row] = field(default_factory=list)
    headline: str = ""  # the answer in one sentence (report/headline.py): first on the page, first in the section


def cell_class(header: str) -> str:
    return ' class="text"' if header in TEXT_COLUMNS else ""


def table_html(headers: list[str], cells: list[list[str]]) -> str:
    head = "".join(f"<th{cell_class(h)}>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td{cell_class(h)}>{escape(c)}</td>" for h, c in zip(headers, row, strict=True)) + "</tr>"
        for row in cells
    )
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def image_html(plot: Plot) -> str:
    """A PNG inlined as a data URI, so the page needs no other file."""
    try:
        data = base64.b64encode(Path(plot.path).read_bytes()).decode("ascii")
    except OSError as exc:
        raise file_error(exc, "read") from None
    return (
        f'<figure><img alt="{escape(plot.caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{escape(plot.caption)}</figcaption></figure>"
    )


def section_html(number: int, view: SectionView, anchor: str) -> str:
    parts = [
        f'<section id="{escape(anchor)}">',
        f"<h2>{number}. {escape(view.title)}</h2>",
        f'<p class="source">from {escape(view.source)}</p>',
    ]
    if view.question:
        parts.append(f"<blockquote>{escape(view.question)}</blockquote>")
    parts.append("<h3>Answer, from the data</h3>")
    if view.headline:
        parts.append(f'<p class="headline">{escape(view.headline)}</p>')
    parts += [
        '<ul class="findings">'
        + "".join(
            f'<li class="{escape(f.flag)}">{escape(f.text)}</li>' if f.flag else f"<li>{escape(f.text)}</li>"
            for f in view.findings
        )
        + "</ul>",
    ]
    if view.note:
        parts.append(f'<p class="note">{escape(view.note)}</p>')
    if view.setup:
        parts.append(f'<p class="setup">Setup: {escape(view.setup)}</p>')
    for heading, note, (headers, cells) in view.tables:
        parts += [f"<h3>{escape(heading)}</h3>", table_html(headers, cells) if cells else "<p>none</p>"]
        if note:
            parts.append(f'<p class="note">{escape(note)}</p>')
    parts += [image_html(p) for p in view.plots]
    for heading, note, (headers, cells) in view.details:
        parts.append(
            f"<details><summary>{escape(heading)}</summary>{table_html(headers, cells)}"
            + (f'<p class="note">{escape(note)}</p>' if note else "")
            + "</details>"
        )
    if view.architecture:
        parts.append(
            f"<details><summary>Architecture</summary><p><code>{escape(view.architecture)}</code></p></details>"
        )
    if view.problems:
        parts.append(
            "<h3>Runs that did not finish</h3><ul>"
            + "".join(
                f'<li class="problem"><b>{escape(p["run"])}</b> ({escape(p["status"])}): '
                f'{escape(p["error"] or "no error recorded")}<br><span class="note">{escape(p["dir"])}</span></li>'
                for p in view.problems
            )
            + "</ul>"
        )
    parts.append("</section>")
    return "\n".join(parts)


def page(title: str, meta: str, views: list[SectionView], anchors: list[str], any_gpu: bool) -> str:
    """The full page: a table of contents, the sections, how to read the figures."""
    toc = "".join(f'<li><a href="#{escape(a)}">{escape(v.title)}</a></li>' for v, a in zip(views, anchors, strict=True))
    parts = [f"<h1>{escape(title)}</h1>", f'<p class="meta">{escape(meta)}</p>']
    if any(v.headline for v in views):  # the answers first, each linked to its section
        parts.append(
            '<nav class="answers"><h2>Answers</h2><ol>'
            + "".join(
                f'<li><a href="#{escape(a)}">{escape(v.title)}</a>: {escape(v.headline)}</li>'
                for v, a in zip(views, anchors, strict=True)
            )
            + "</ol></nav>"
        )
    elif len(views) > 1:
        parts.append(f"<nav><ol>{toc}</ol></nav>")
    parts += [section_html(i, v, a) for i, (v, a) in enumerate(zip(views, anchors, strict=True), 1)]
    if not any_gpu:
        parts.append('<p class="note">GPU utilization: not measured (no run wrote gpu.jsonl).</p>')
    parts.append(
        "<h2>How to read this page</h2><dl>"
        + "".join(f"<dt><b>{escape(term)}</b></dt><dd>{escape(text)}</dd>" for term, text in READING)
        + "</dl>"
    )
    body = "\n".join(parts)
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{escape(title)}</title>\n'
        f"<style>{STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


# ---- Markdown ------------------------------------------------------------------------------------------
MD_SPECIAL = "\\`*_[]|"  # a backslash first: each of these is written with one before it


def md_text(text: str) -> str:
    """Text from runs, inert in Markdown: no raw HTML, no link or image syntax, no table breaks, no emphasis
    or code from a label's `*`, `_` or backtick."""
    out = escape(str(text), quote=False).replace("\n", " ")
    for char in MD_SPECIAL:
        out = out.replace(char, "\\" + char)
    return out


def md_anchor(heading: str) -> str:
    """The anchor GitHub (and most Markdown renderers) give a heading: lower case, spaces as hyphens, other
    punctuation dropped."""
    kept = "".join(c for c in heading.strip().lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def markdown(title: str, meta: str, views: list[SectionView], plot_dir: str) -> str:
    from ddplab.report.tables import markdown_table

    parts = [f"# {md_text(title)}", md_text(meta)]
    if any(v.headline for v in views):
        answers = (
            f"{i}. [{md_text(v.title)}](#{md_anchor(f'{i}. {v.title}')}): {md_text(v.headline)}"
            for i, v in enumerate(views, 1)
        )
        parts += ["## Answers", "\n".join(answers)]
    for i, v in enumerate(views, 1):
        parts += [f"## {i}. {md_text(v.title)}", f"from {md_text(v.source)}"]
        if v.question:
            parts.append(f"> {md_text(v.question)}")
        parts.append("### Answer, from the data")
        if v.headline:
            parts.append(f"**{md_text(v.headline)}**")
        parts += [
            "\n".join(
                f"- {'**' + f.flag + ':** ' if f.flag in ('unreliable', 'check') else ''}{md_text(f.text)}"
                for f in v.findings
            ),
        ]
        if v.note:
            parts.append(md_text(v.note))
        if v.setup:
            parts.append(f"Setup: {md_text(v.setup)}")
        for heading, note, (headers, cells) in [*v.tables, *v.details]:
            table = markdown_table([md_text(h) for h in headers], [[md_text(c) for c in row] for row in cells])
            parts += [f"### {md_text(heading)}", table if cells else "none"] + ([md_text(note)] if note else [])
        parts += [f"![{md_text(p.caption)}]({plot_dir}/{p.path.name})" for p in v.plots]
        if v.problems:
            parts += [
                "### Runs that did not finish",
                "\n".join(
                    f"- {md_text(p['run'])} ({md_text(p['status'])}): {md_text(p['error'] or 'no error recorded')}"
                    for p in v.problems
                ),
            ]
    parts += ["## How to read this report", "\n".join(f"- **{t}**: {md_text(x)}" for t, x in READING)]
    return "\n\n".join(parts) + "\n"

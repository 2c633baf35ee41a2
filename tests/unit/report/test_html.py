"""index.html and report.md (report/html.py): self-contained, with the sections' tables, text from runs escaped."""

import re

from ddplab.report.build import build_report

from support.reports import read_csv, write_axis_sweep

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_markdown_has_the_sections_tables(sweep_report):
    md = sweep_report[0]["report_md"].read_text()
    assert "| workers=1 | 2 | 71.00 ± 1.41 | 91.00 ± 1.41 | +20.0 | 1.000 | 0.800 (2) |" in md
    assert "| workers=2 | workers=1 | 1.71x | 171% (ideal 1x) |" in md
    assert "- w4-s0 (failed): training diverged: loss is nan at epoch 2" in md


def test_html_is_self_contained_with_embedded_pngs(sweep_report):
    result, _ = sweep_report
    page = result["index_html"].read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*https?:""", page, re.I)
    assert "http://" not in page and "https://" not in page and "<script" not in page.lower()
    assert page.count('src="data:image/png;base64,') == len(result["plots"])
    names = {p.name for p in result["plots"]}
    assert names == {
        "s01-curves.png",
        "s01-speed.png",
        "s01-time-breakdown.png",
        "s01-step-loss.png",
        "s01-gpu-utilization.png",
    }  # three epochs: short enough for a per-step curve
    assert "GPU utilization: not measured" not in page and "training diverged" in page
    for path in result["plots"]:
        assert path.read_bytes().startswith(PNG_MAGIC)


def test_text_from_runs_is_escaped_in_html_markdown_and_csv(tmp_path):
    evil, formula = "<img src=x onerror=alert(1)>", "=cmd|calc"
    sweep = write_axis_sweep(tmp_path / "s", "config", [(evil, {}, {}), (formula, {"optim": {"lr": 0.1}}, {})])
    result = build_report([sweep], tmp_path / "out", title="a <script> title")
    page = result["index_html"].read_text()
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page and "<script>" not in page
    md = result["report_md"].read_text()
    assert "<img" not in md and "<script>" not in md and "&lt;img src=x onerror=alert(1)&gt;" in md
    rows = read_csv(result["points_csv"])
    assert [r["point"] for r in rows] == [evil, "'" + formula]  # a formula stays text in a spreadsheet


def test_markdown_keeps_a_labels_emphasis_and_code_characters_as_text():
    from ddplab.report.html import md_anchor, md_text

    assert md_text("lr_0.1 *fast* `x` a\\b [c](d) |e|") == ("lr\\_0.1 \\*fast\\* \\`x\\` a\\\\b \\[c\\](d) \\|e\\|")
    assert md_anchor("2. DDP x2 vs 1 device (seeds: 3)") == "2-ddp-x2-vs-1-device-seeds-3"


def test_markdowns_answers_link_to_their_sections(sweep_report):
    from ddplab.report.html import md_anchor

    md = sweep_report[0]["report_md"].read_text()
    answers = [line for line in md.split("## Answers\n", 1)[1].split("\n## ", 1)[0].splitlines() if line]
    headings = [line[3:] for line in md.splitlines() if line.startswith("## ") and line[3:4].isdigit()]
    assert len(answers) == len(headings) >= 1
    for answer, heading in zip(answers, headings, strict=True):
        assert f"](#{md_anchor(heading.replace(chr(92), ''))}): " in answer, (answer, heading)

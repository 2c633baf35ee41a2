"""The report of a real small sweep, read as a reader would: in headless Chromium.

Two runs train for real; the second trains while busy loops hold every core. The page must
say its speedup is unreliable and why, every figure a finding states must be a cell of its
section's tables, the main tables must fit the page without a horizontal scroll, and every
legend must fit its figure. Skipped, with the reason, where Chromium is not installed
(scripts/test.sh installs Debian's chromium when it runs as root).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from ddplab.report.build import build_report

from support import tiers

BROWSER = tiers.browser()
pytestmark = tiers.skipif("browser", None if BROWSER else "headless Chromium not installed (apt-get install chromium)")

SWEEP = """
[sweep]
name = "browser"
description = "one process vs two DDP workers, the second under load"

[base.data]
dataset = "synthetic"
synthetic_size = 512
image_size = 16
num_classes = 4
crop_padding = 0
flip = false

[base.model]
width = 0.5

[base.train]
epochs = 3
batch_size = 32
device = "cpu"
eval_train_images = 256

[base.output]
tensorboard = false

[[variants]]
label = "1 worker"

[[variants]]
label = "ddp x2 with a long label that must wrap in the legend"
"dist.strategy" = "ddp"
"dist.nproc" = 2
"train.batch_size" = 16

[[sections]]
title = "Scaling"
question = "Does a second worker pay off?"
kind = "scaling"
points = ["1 worker", "ddp x2 with a long label that must wrap in the legend"]
baseline = "1 worker"
"""

# Read the rendered page: what a reader sees, gathered by a script added to a copy of the page.
PROBE = """<script>
window.addEventListener("load", () => {
  const text = el => el.textContent.replace(/\\s+/g, " ").trim();
  const sections = [...document.querySelectorAll("section")].map(s => ({
    title: text(s.querySelector("h2")),
    top: s.getBoundingClientRect().top,
    headline: s.querySelector("p.headline") ? text(s.querySelector("p.headline")) : "",
    findings: [...s.querySelectorAll("ul.findings > li")].map(li => ({text: text(li), flag: li.className,
      shown: getComputedStyle(li, "::before").content})),
    cells: [...s.querySelectorAll("td, th")].map(text),
    scrolls: [...s.querySelectorAll(":scope > .scroll")].map(d => [d.scrollWidth, d.clientWidth]),
    images: [...s.querySelectorAll("img")].map(i => [i.naturalWidth, i.getBoundingClientRect().right]),
  }));
  const probe = document.createElement("pre");
  probe.id = "probe";
  const answers = [...document.querySelectorAll("nav.answers li")].map(
    li => [text(li), li.getBoundingClientRect().bottom]);
  probe.textContent = JSON.stringify({page: [document.documentElement.scrollWidth, window.innerWidth], sections,
    answers, height: window.innerHeight});
  document.body.appendChild(probe);
});
</script>"""

NUMBER = re.compile(r"[-+]?\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+")  # decimals and thousands: figures, not counts


def run_sweep_with_load_on_the_second_run(sweep_file: Path, out: Path) -> None:
    """Burn every core from the moment the sweep says its second run starts until the sweep ends."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddplab", "sweep", str(sweep_file), "--out", str(out), "--no-report", "--no-estimate"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    burners, lines = [], []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("[2/2]") and not burners:
                burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count())]
        assert proc.wait(timeout=600) == 0, "".join(lines)[-3000:]
    finally:
        proc.kill()
        for b in burners:
            b.kill()
            b.wait()
    assert burners, "".join(lines)


def render(index: Path, tmp_path: Path) -> dict:
    probe_page = index.with_name("probe.html")
    probe_page.write_text(index.read_text().replace("</body>", PROBE + "</body>"))
    dom = subprocess.run(
        [
            BROWSER,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            f"--user-data-dir={tmp_path / 'chromium'}",
            "--window-size=1400,900",
            "--dump-dom",
            probe_page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert found, dom.stderr[-2000:]
    return json.loads(
        found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    )


def test_the_report_of_a_real_sweep_reads_right_in_a_browser(tmp_path):
    sweep_file = tmp_path / "browser.toml"
    sweep_file.write_text(SWEEP)
    out = tmp_path / "sweep"
    run_sweep_with_load_on_the_second_run(sweep_file, out)
    loaded = json.loads(
        (out / "runs" / "ddp-x2-with-a-long-label-that-must-wrap-in-the-legend" / "metrics.jsonl")
        .read_text()
        .splitlines()[-1]
    )
    assert loaded["other_cpu_share"] >= 0.10  # the busy loops were measured as other work

    result = build_report([out], out / "report")
    page = render(result["index_html"], tmp_path)
    width, window = page["page"]
    assert width <= window, "the page scrolls sideways at 1400 px"
    (scaling,) = [s for s in page["sections"] if s["title"].endswith("Scaling")]

    # The speedup measured under load is said to be unreliable, and why; the page shows the flag.
    speedup = [f for f in scaling["findings"] if "the training throughput of 1 worker" in f["text"]]
    assert len(speedup) == 1, scaling["findings"]
    assert speedup[0]["flag"] == "unreliable" and "the clocks measured other work" in speedup[0]["text"]
    assert "unreliable" in speedup[0]["shown"]

    # The first screen answers: one line per section, each inside the window, each figure in it a cell of its
    # section's tables; the section's own answer starts with the same sentence.
    ((answer, bottom),) = page["answers"]
    assert answer.startswith("Scaling: ") and 0 < bottom <= page["height"], (answer, bottom, page["height"])
    assert scaling["headline"] == answer.removeprefix("Scaling: ")
    for number in NUMBER.findall(answer):
        assert number.lstrip("+") in " | ".join(scaling["cells"]), (number, answer)

    # Every figure a finding states is a cell (or part of one) of its section's tables.
    cells = " | ".join(scaling["cells"])
    for finding in scaling["findings"]:
        for number in NUMBER.findall(finding["text"]):
            assert number.lstrip("+") in cells, (number, finding["text"])
    assert any(NUMBER.findall(f["text"]) for f in scaling["findings"])

    # The main tables fit without a sideways scroll; plots are shown, none reaching past the window.
    assert scaling["scrolls"] and all(inner <= shown for inner, shown in scaling["scrolls"]), scaling["scrolls"]
    assert scaling["images"] and all(natural > 0 and 0 < right <= window for natural, right in scaling["images"])

    # Every legend entry is a full label, and every legend lies inside its figure.
    plots = result["sections"][0]["plots"]
    legends = {entry for p in plots for entry in p.legend}
    assert "ddp x2 with a long label that must wrap in the legend" in legends
    assert all(not p.clipped for p in plots), [(p.name, p.clipped) for p in plots]
    assert all(p.max_lines <= 2 * 4 for p in plots)


def test_six_answers_fit_the_first_screen(tmp_path):
    """The assignment's report has six sections: their one-line answers all lie inside a 1400x900 window, above
    the first section, each figure in one of them a cell of its section's tables. Run folders with known numbers
    (no training): three kinds of section, twice each, as the assignment declares them."""
    from support.reports import write_sweep
    from support.runs import write_manifest

    sweep = write_sweep(tmp_path)  # 1 worker and DDP x2, two seeds each, one failed run
    kinds = ("scaling", "compare", "overfitting")
    sections = [
        {
            "title": f"Q{i + 1}. {kind.title()} question of the assignment, in a long title",
            "question": "?",
            "kind": kind,
            "runs": ["w1-s0", "w1-s1", "w2-s0", "w2-s1"],
            "baseline_runs": ["w1-s0", "w1-s1"],
            "not_measured": [],
        }
        for i, kind in enumerate(kinds * 2)
    ]
    manifest = json.loads((sweep / "manifest.json").read_text())
    write_manifest(
        sweep,
        [{k: r[k] for k in ("name", "point", "seed", "status")} for r in manifest["runs"]],
        axes=("workers",),
        sections=sections,
    )
    result = build_report([sweep], tmp_path / "report")
    page = render(result["index_html"], tmp_path)
    assert len(page["answers"]) == 6 == len(page["sections"])
    first_section = min(s["top"] for s in page["sections"])
    for (answer, bottom), section in zip(page["answers"], page["sections"], strict=True):
        assert bottom <= page["height"] and bottom < first_section, (answer, bottom, page["height"])
        assert answer == f"{section['title'].split('. ', 1)[1]}: {section['headline']}"  # h2: "N. title"
        for number in NUMBER.findall(answer):
            assert number.lstrip("+") in " | ".join(section["cells"]), (number, answer)

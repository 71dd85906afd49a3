"""The history page of a ROCm version, written by its Snakemake rule from a real archive (runs
archived by the archive writer, TPOT shifted at a known run), opened in real headless chromium:
one figure per cell and metric, each drawn, the change point marked on the shifted metrics and
on no other, and each run linked to its archived folder and report."""

from __future__ import annotations

import html
import json
import re
import subprocess

import pytest
import yaml
from support import html_report_probe
from support.docker_env import PYTHON, REPO_ROOT
from support.history_runs import CELL, archive_series

PROBE = """<!DOCTYPE html><html><body><pre id="out">not rendered</pre>
<iframe id="page" src="PAGE" style="width:1600px;height:1000px"></iframe>
<script>
const frame = document.getElementById("page");
frame.onload = () => {
  const doc = frame.contentDocument;
  const figures = [...doc.querySelectorAll("figure.plot")].map((f) => {
    const svg = f.querySelector("svg");
    const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
    const marks = [...f.querySelectorAll('[id^="changepoint-"]')].filter(
      (m) => m.getBBox().height > 0 || m.getBBox().width > 0);
    return {cell: f.dataset.cell, metric: f.dataset.metric, width: box.width,
            height: box.height, marks: marks.length, said: +f.dataset.changePoints};
  });
  const runs = [...doc.querySelectorAll("a.run")].map((a) => a.getAttribute("href"));
  document.getElementById("out").textContent = JSON.stringify({figures, runs});
};
</script></body></html>"""


@pytest.mark.slow
def test_history_page_in_headless_chromium(tmp_path):
    if html_report_probe.chromium() is None:
        pytest.skip("chromium is not installed: .ci/browser-up.sh installs Debian's chromium")
    archive_series(tmp_path / "results", [30.0, 30.1, 29.9, 30.2, 36.0, 36.1, 35.9])
    cfg = yaml.safe_load((REPO_ROOT / "config/local.yaml").read_text())
    cfg.setdefault("report", {})["min_change_pct"] = 5
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    # The archive receipt is the rule's input; the runs were archived outside Snakemake.
    r = subprocess.run(
        [PYTHON, "-m", "snakemake", "-s", str(REPO_ROOT / "Snakefile"), "-d", str(tmp_path),
         "--configfile", str(tmp_path / "cfg.yaml"), "--cores", "1",
         "results/history/rocm7.2/index.html"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    page = tmp_path / "results/history/rocm7.2/index.html"
    probe = page.parent / "probe.html"
    probe.write_text(PROBE.replace("PAGE", page.name))
    proc = subprocess.run(
        [html_report_probe.chromium(), "--headless", "--disable-gpu", "--no-sandbox",
         "--allow-file-access-from-files", "--virtual-time-budget=30000", "--dump-dom",
         probe.as_uri()],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    match = re.search(r'<pre id="out">(.*?)</pre>', proc.stdout, re.S)
    assert match, proc.stderr[-2000:]
    seen = json.loads(html.unescape(match.group(1)))
    metrics = {"mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "output_throughput", "strict_match"}
    assert sorted((f["cell"], f["metric"]) for f in seen["figures"]) == sorted(
        (CELL, m) for m in metrics
    )
    for f in seen["figures"]:
        assert f["width"] > 300 and f["height"] > 150, f
        shifted = f["metric"] in ("mean_tpot_ms", "mean_e2el_ms")  # e2el = ttft + osl x tpot
        # both arms shift at the same run: a line and a marker each
        assert f["said"] == (2 if shifted else 0), f
        assert f["marks"] == 2 * f["said"], f
    assert len(seen["runs"]) == 7
    for href in seen["runs"]:
        assert (page.parent / href / "MANIFEST.json").is_file(), href
        assert (page.parent / href / "report" / "report.md").is_file(), href
    text = page.read_text()
    since = text[text.index('id="since-last"') : text.index("<h2>Runs</h2>")]
    assert "mean_tpot_ms" in since and since.count("<tr>") == 1 + 2 * 5  # 2 arms x 5 series
    points = (page.parent / "change_points.csv").read_text().splitlines()
    assert len(points) == 1 + 4  # tpot and e2el, both arms

"""Open Snakemake's HTML report in real headless chromium and read what it rendered.

The report is a single-page app: its results appear only after its scripts ran and a category
is chosen. A probe page beside the report loads it in a frame, clicks each category and each
stage (subcategory) as a person would, and writes what the tables then list (file names and
the data their view buttons open) into its own DOM, which ``chromium --dump-dom`` prints.
``--allow-file-access-from-files`` lets the probe read the framed report from file://.
"""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote

PROBE = """<!DOCTYPE html>
<html><body><pre id="out">not rendered</pre>
<iframe id="report" src="REPORT_NAME" style="width:1600px;height:1000px"></iframe>
<script>
const CATEGORIES = CATEGORIES_JSON;
const STAGES = STAGES_JSON;
const out = document.getElementById("out");
const frame = document.getElementById("report");
const wait = (ms) => new Promise((done) => setTimeout(done, ms));
// Links first: a list item around a link has the same text but no click handler.
const byText = (doc, text) =>
  [...doc.querySelectorAll("a"), ...doc.querySelectorAll("button, li, span")].find(
    (el) => el.textContent.trim() === text);
const tableRows = (doc) =>
  Array.from(doc.querySelectorAll("table tbody tr")).map((tr) => {
    const eye = tr.querySelector('a[iconname="eye"]');
    return { file: tr.querySelector("td").textContent.trim(),
             href: eye ? eye.getAttribute("href") : null };
  });
async function collect(doc, state) {
  const rows = tableRows(doc);
  // Open one figure as a person would: the browser must decode and lay it out.
  const png = Array.from(doc.querySelectorAll("table tbody tr")).find(
    (tr) => tr.querySelector("td").textContent.trim().endsWith(".png"));
  if (state.shown === null && png) {
    png.querySelector('a[iconname="eye"]').click(); await wait(1500);
    const img = Array.from(doc.querySelectorAll("img")).find(
      (i) => (i.getAttribute("src") || "").startsWith("data:image/png"));
    state.shown = img ? { file: png.querySelector("td").textContent.trim(),
                          width: img.naturalWidth, height: img.naturalHeight } : { width: 0 };
  }
  return rows;
}
frame.onload = async () => {
  try {
    await wait(1000);
    const doc = frame.contentDocument;
    const state = { found: {}, shown: null };
    for (const category of CATEGORIES) {
      const home = byText(doc, "Results");
      if (home) { home.click(); await wait(300); }
      const link = byText(doc, category);
      if (!link) { state.found[category] = null; continue; }
      link.click(); await wait(500);
      state.found[category] = {};
      if (doc.querySelector("table tbody tr")) {  // one stage: its files straight away
        state.found[category]["(one stage)"] = await collect(doc, state);
        continue;
      }
      for (const stage of STAGES) {
        const sub = byText(doc, stage);
        if (!sub) continue;
        sub.click(); await wait(500);
        state.found[category][stage] = await collect(doc, state);
        const back = byText(doc, category);
        if (back) { back.click(); await wait(300); }
      }
    }
    out.textContent = JSON.stringify(state);
  } catch (err) {
    out.textContent = "probe failed: " + err;
  }
};
</script></body></html>
"""


def chromium() -> str | None:
    """Debian's chromium (``.ci/browser-up.sh`` installs it), or None."""
    return shutil.which("chromium")


def rendered(report_html: Path, categories: list[str], stages: list[str]) -> dict:
    """What the report shows per category and stage once rendered in headless chromium:
    ``{"found": {category: {stage: [{"file", "href"}]}}, "shown": {"width", "height"}}``."""
    probe = report_html.parent / "probe.html"
    probe.write_text(
        PROBE.replace("REPORT_NAME", report_html.name)
        .replace("CATEGORIES_JSON", json.dumps(categories))
        .replace("STAGES_JSON", json.dumps(stages))
    )
    proc = subprocess.run(
        [chromium(), "--headless", "--disable-gpu", "--no-sandbox",
         "--allow-file-access-from-files", "--virtual-time-budget=60000",
         "--dump-dom", probe.as_uri()],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    match = re.search(r'<pre id="out">(.*?)</pre>', proc.stdout, re.S)
    assert match, f"chromium printed no probe page (rc {proc.returncode}): {proc.stderr[-2000:]}"
    text = html.unescape(match.group(1))
    assert text.startswith("{"), f"the probe did not finish: {text[:500]}"
    return json.loads(text)


def data_uri_bytes(uri: str) -> bytes:
    """The bytes a ``data:...;base64,...`` (or percent-encoded) URI holds."""
    head, _, payload = uri.partition(",")
    if head.endswith(";base64"):
        return base64.b64decode(payload)
    return unquote(payload).encode()

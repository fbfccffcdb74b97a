"""Screenshot a page of Snakemake's HTML report in headless Chromium:
``python -m domino.tools.report_screenshot reports/report.html``.

The report is one offline file whose pages open on a click; this tool opens one without a click:
it writes a copy of the report with a script that shows the result named ``--page`` (default the
model card, ``model_card.html``) once the report has loaded, then has Chromium, headless, with a
fresh profile and no network services, take a screenshot of it (``--out``, default beside the
report). Chromium comes from the system (``apt-get install chromium``), not from Python.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from . import tool_parser

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars")

# shows the result whose path ends in the page's name, as a click on its entry would (the report's
# app and results are globals of its own scripts)
SHOW_PAGE = """<script>
(function () {{
  var name = {name}, tries = 0;
  function show() {{
    if (typeof app === "undefined" || !app || typeof results === "undefined") {{
      if (tries++ < 100) {{ setTimeout(show, 50); }}
      return;
    }}
    var key = Object.keys(results).find(function (k) {{ return k === name || k.endsWith("/" + name); }});
    if (key === undefined) {{ document.title = "no result named " + name; return; }}
    app.setView({{content: "html", contentPath: results[key].data_uri, resultPath: key}});
    document.title = "showing " + key;
  }}
  window.addEventListener("load", function () {{ setTimeout(show, 200); }});
}})();
</script>
"""


def with_page_shown(report_html: str, page: str) -> str:
    """The report's HTML with the script that opens ``page`` after loading."""
    if "</body>" not in report_html:
        raise ValueError("not an HTML page: no </body>")
    script = SHOW_PAGE.format(name=json.dumps(page))
    head, _, tail = report_html.rpartition("</body>")
    return f"{head}{script}</body>{tail}"


def find_browser(name: str | None = None) -> str:
    for candidate in ([name] if name else BROWSERS):
        found = shutil.which(candidate)
        if found:
            return found
    raise SystemExit(f"report_screenshot: no Chromium found (tried {', '.join([name] if name else BROWSERS)}); "
                     "install it (apt-get install chromium) or pass --browser PATH")


def screenshot(report: Path, out: Path, page: str = "model_card.html", browser: str | None = None,
               size: tuple[int, int] = (1400, 1000), wait_ms: int = 8000) -> Path:
    """Write a PNG of ``page`` as the report shows it; returns ``out``."""
    exe = find_browser(browser)
    with tempfile.TemporaryDirectory() as tmp:
        shown = Path(tmp) / "report.html"
        shown.write_text(with_page_shown(report.read_text(errors="replace"), page))
        cmd = [exe, *FLAGS, f"--user-data-dir={Path(tmp) / 'profile'}", f"--window-size={size[0]},{size[1]}",
               f"--virtual-time-budget={wait_ms}", f"--screenshot={out.resolve()}", shown.as_uri()]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not out.exists():
        raise SystemExit(f"report_screenshot: {exe} failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    return out


def parser() -> argparse.ArgumentParser:
    p = tool_parser("report_screenshot", __doc__)
    p.add_argument("report", type=Path, help="the report: snakemake --report reports/report.html")
    p.add_argument("--page", default="model_card.html", help="the result to show, by file name")
    p.add_argument("--out", type=Path, help="the PNG to write (default: beside the report, named after the page)")
    p.add_argument("--browser", help="the Chromium executable (default: the first of %s on PATH)" % ", ".join(BROWSERS))
    return p


def main(argv=None) -> None:
    a = parser().parse_args(argv)
    if not a.report.is_file():
        raise SystemExit(f"report_screenshot: {a.report} does not exist; build it first "
                         "(snakemake --cores 1 --report reports/report.html reports/model_card.md)")
    out = a.out or a.report.with_name(f"{Path(a.page).stem}_screenshot.png")
    print(screenshot(a.report, out, a.page, a.browser))


if __name__ == "__main__":
    main()

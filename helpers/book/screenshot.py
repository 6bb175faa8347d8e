"""The README's picture of a report: the rounds table of a workbook report's index.html, rendered by headless
Chromium into a PNG (docs/img/report-rounds.png). Run it after `make workbook`:

    python -m helpers.book.screenshot              # reports/latest → docs/img/report-rounds.png
    python -m helpers.book.screenshot REPORT_DIR --out picture.png
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from helpers.paths import REPO_ROOT, REPORTS_DIR

OUT = REPO_ROOT / "docs" / "img" / "report-rounds.png"
WIDTH_PX = 1200
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


class ScreenshotError(RuntimeError):
    """A report or a browser that cannot make the picture (one line)."""


def rounds_page(index_html: str) -> str:
    """index.html cut to its style, the config line and the sections from 'Before / after' on (the rounds table
    included): what the picture shows."""
    style = re.search(r"<style>.*?</style>", index_html, re.S)
    start = index_html.find("<h2>Before / after</h2>")
    if style is None or start < 0:
        raise ScreenshotError("this index.html has no before/after section: is it a workbook report's index?")
    config = re.search(r"<p>config: .*?</p>", index_html)
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8">{style.group(0)}</head><body>'
            f"{config.group(0) if config else ''}{index_html[start:]}")


def height_px(page: str) -> int:
    """A window tall enough for the page (Chromium's --screenshot takes the window, not the page): a generous
    guess from its row count; `crop` cuts the blank below."""
    return min(16000, 400 + 140 * page.count("<tr"))


def crop(png: Path, margin_px: int = 24) -> None:
    """Cut the blank rows below the last drawn one, keeping `margin_px` of them."""
    import matplotlib.image as mpimg
    image = mpimg.imread(png)
    drawn = (image[..., :3] < 0.99).any(axis=(1, 2)).nonzero()[0]
    if len(drawn):
        mpimg.imsave(png, image[:min(len(image), drawn[-1] + 1 + margin_px)])


def screenshot(report: Path = REPORTS_DIR / "latest", out: Path = OUT, chromium: str | None = None) -> Path:
    """Render `report`/index.html's before/after and rounds tables to `out` (PNG, WIDTH_PX wide); the path."""
    index = Path(report) / "index.html"
    if not index.is_file():
        raise ScreenshotError(f"no {index}: run `make workbook` first, or pass a report folder")
    browser = chromium or shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise ScreenshotError("no chromium on PATH (`make chromium` installs it)")
    page = rounds_page(index.read_text(encoding="utf-8"))
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "rounds.html"
        html.write_text(page, encoding="utf-8")
        proc = subprocess.run([browser, *ARGS, f"--screenshot={out}", f"--window-size={WIDTH_PX},{height_px(page)}",
                               html.as_uri()], capture_output=True, text=True, timeout=120)
    if proc.returncode or not out.is_file():
        raise ScreenshotError(f"chromium exited {proc.returncode} without {out}: "
                              f"{(proc.stderr.strip().splitlines() or [''])[-1]}")
    crop(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.book.screenshot", description=__doc__.splitlines()[0])
    parser.add_argument("report", nargs="?", default=str(REPORTS_DIR / "latest"), help="a report folder")
    parser.add_argument("--out", default=str(OUT), help="the PNG to write")
    args = parser.parse_args(argv)
    try:
        print(screenshot(Path(args.report), Path(args.out)))
    except ScreenshotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

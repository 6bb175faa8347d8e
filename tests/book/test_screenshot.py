"""The README's picture of a report, made by a script from a report's index.html (helpers/book/screenshot.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from helpers.book import screenshot

INDEX = """<!DOCTYPE html><html><head><title>x</title><style>td{padding:1px}</style></head><body>
<h1>Tuning workbook report</h1><p>config: none given (the notebooks' defaults; 01's start_from)</p>
<p>16 of 16 notebooks ran</p><table><tr><td>00_environment</td></tr></table>
<h2>Before / after</h2><table><tr><td>throughput, side by side</td></tr></table>
<h2>Rounds</h2><table class="rounds"><tr><td>1</td><td>kernels_native</td></tr></table></body></html>"""


def test_the_picture_holds_the_config_line_and_the_tables_from_before_after_on():
    page = screenshot.rounds_page(INDEX)
    assert "<style>td{padding:1px}</style>" in page and "config: none given" in page
    assert "<h2>Before / after</h2>" in page and "kernels_native" in page and "00_environment" not in page
    assert screenshot.height_px(page) == 400 + 140 * 2
    with pytest.raises(screenshot.ScreenshotError, match="no before/after section"):
        screenshot.rounds_page("<html><style></style><body>no tables</body></html>")


def test_a_missing_report_is_one_line(tmp_path, capsys):
    assert screenshot.main([str(tmp_path / "none"), "--out", str(tmp_path / "p.png")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: no {tmp_path / 'none' / 'index.html'}: run `make workbook` first, or pass a report folder"]


@pytest.mark.ci_required
@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium (make test installs it with apt-get)")
def test_chromium_renders_the_picture(tmp_path):
    (tmp_path / "index.html").write_text(INDEX, encoding="utf-8")
    out = screenshot.screenshot(tmp_path, tmp_path / "rounds.png")
    data = Path(out).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(data[16:20], "big") == screenshot.WIDTH_PX
    # cut below the last table: far shorter than the window it was taken in
    assert 100 < int.from_bytes(data[20:24], "big") < screenshot.height_px(screenshot.rounds_page(INDEX))

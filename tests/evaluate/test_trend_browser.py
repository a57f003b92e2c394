"""The trend page in a real headless Chromium: three nights of small runs, rows, links, plot.

Skipped, with the reason, when Chromium is not on PATH and Debian's package cannot be
installed (see tests/evaluate/browser.py).
"""

from __future__ import annotations

import io
import shutil
import urllib.parse
import urllib.request

import pytest
from PIL import Image

from evaluate import EvaluateConfig, run, trend
from tests.evaluate import browser
from tests.evaluate.conftest import DATE

pytestmark = pytest.mark.e2e

# Each night's min_accuracy, in the order they are evaluated: the second is a backfill of an
# older date, the third is not blessed (so the "why" column says why not).
NIGHTS = {"2026-01-31": 0.1, "2026-01-29": 0.1, "2026-01-30": 0.999}

ROWS = "Array.from(document.querySelectorAll('#nights tbody tr'))"
CELLS = f"{ROWS}.map(row => Array.from(row.cells).map(cell => cell.innerText.trim()))"
LINKS = "Array.from(document.querySelectorAll('#nights a')).map(a => a.href)"
IMAGES = (
    "Array.from(document.images).map(i => ({src: i.src, complete: i.complete, "
    "width: i.naturalWidth}))"
)


@pytest.fixture(scope="session")
def chromium() -> str:
    """Chromium's path; installs Debian's package when missing, else skips with the reason."""
    path, reason = browser.find_or_install_chromium()
    if path is None:
        pytest.skip(f"no headless Chromium: {reason}")
    return path


@pytest.fixture
def three_nights(trained_template, tmp_path):
    """`<tmp>/runs` with three evaluated nights of one small trained run, out of date order."""
    template, _ = trained_template
    root = tmp_path / "runs"
    for date, min_accuracy in NIGHTS.items():
        shutil.copytree(template / DATE, root / date)
        config = EvaluateConfig(
            output_root=str(root), date=date, batch_size=128, min_accuracy=min_accuracy
        )
        run(config)
    return root


def _path(url: str) -> str:
    parsed = urllib.parse.urlparse(url)
    assert parsed.scheme == "file", url
    return urllib.request.url2pathname(parsed.path)


def _loaded(images: list[dict]) -> bool:
    return bool(images) and all(i["complete"] and i["width"] > 0 for i in images)


def test_trend_page_of_three_nights_in_chromium(chromium, three_nights, tmp_path):
    index = three_nights / trend.INDEX_FILE
    with browser.Browser(chromium, str(tmp_path / "chromium-profile")) as page:
        page.open(index.as_uri())
        screenshot = page.screenshot()
        (tmp_path / "index.png").write_bytes(screenshot)
        rows = page.evaluate(CELLS)
        plot = page.evaluate(IMAGES)
        links = page.evaluate(LINKS)

        image = Image.open(io.BytesIO(screenshot))
        assert image.format == "PNG" and image.width >= 1000 and image.height >= 600
        # Not a blank page: text, table lines and the plot's colours.
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 100

        assert [row[0] for row in rows] == sorted(NIGHTS)
        verdicts = {row[0]: row[4] for row in rows}
        assert verdicts == {"2026-01-29": "yes", "2026-01-30": "no", "2026-01-31": "yes latest"}
        pushed = {row[0]: row[6] for row in rows}
        assert pushed == {"2026-01-29": "2026012900", "2026-01-30": "–", "2026-01-31": "2026013100"}
        why = {row[0]: row[5] for row in rows}
        assert "is below min_accuracy 0.9990" in why["2026-01-30"]
        assert "pointer stays on the newer run 2026-01-31" in why["2026-01-29"]

        assert len(plot) == 1 and plot[0]["src"] == (three_nights / trend.TREND_PNG).as_uri()
        assert _loaded(plot), plot

        assert len(links) == 5 * len(NIGHTS)
        for link in links:
            path = _path(link)
            assert path.startswith(str(three_nights) + "/"), link
            page.open(link)  # raises on net::ERR_FILE_NOT_FOUND
            date = path[len(str(three_nights)) + 1 :].split("/")[0]
            if link.endswith(".png"):
                assert _loaded(page.evaluate(IMAGES)), link
            elif link.endswith(".json"):  # metrics.json, blessing.json
                assert f'"date": "{date}"' in page.evaluate("document.body.innerText")
            else:
                assert page.evaluate("document.title") == f"Evaluation of run {date}"
                embedded = page.evaluate(IMAGES)
                assert len(embedded) == 3 and _loaded(embedded), link
                assert all(i["src"].startswith("data:image/png;base64,") for i in embedded)
                (back,) = page.evaluate("Array.from(document.links).map(a => a.href)")
                assert _path(back) == str(index)

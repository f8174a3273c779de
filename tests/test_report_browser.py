"""The HTML report opened in a real headless Chromium, offline, and screenshotted."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from virtlab.export import write_reports

SAMPLE = Path(__file__).parent / "data" / "results_sample.json"
WIDTH, HEIGHT = 1280, 2400
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


@pytest.fixture(scope="module")
def screenshot(tmp_path_factory) -> Path:
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium) and could not be found on PATH")
    out = tmp_path_factory.mktemp("report")
    results = json.loads(SAMPLE.read_text(encoding="utf-8"))
    _, html = write_reports(results, out)
    png = out / "report.png"
    command = [
        browser,
        "--headless",
        "--no-sandbox",  # we run as root in the lab container
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={out / 'profile'}",
        f"--screenshot={png}",
        f"--window-size={WIDTH},{HEIGHT}",
        html.resolve().as_uri(),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert png.exists(), f"chromium wrote no screenshot (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    return png


def test_screenshot_is_a_png_of_the_window_size(screenshot):
    data = screenshot.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    length, chunk = struct.unpack(">I4s", data[8:16])
    assert (length, chunk) == (13, b"IHDR")
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (WIDTH, HEIGHT)


def test_screenshot_is_not_blank(screenshot):
    import matplotlib.image
    import numpy as np

    pixels = matplotlib.image.imread(screenshot)[:, :, :3]
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 50, "the page rendered (almost) one colour"
    # text and tables in the top part, charts further down: neither half is empty
    for part in (pixels[: HEIGHT // 2], pixels[HEIGHT // 2 :]):
        assert (part < 0.5).any(axis=2).mean() > 0.005
    # the chart bars: the container's blue is drawn somewhere
    blue = (pixels[:, :, 2] > 0.8) & (pixels[:, :, 0] < 0.3) & (pixels[:, :, 1] < 0.5)
    assert blue.sum() > 1000

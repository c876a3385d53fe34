"""The trace viewer in headless Chromium (issue 19): render time of 40, 400 and 4,000-event
traces and the page's bytes per event.

Per size, over ``ROUNDS`` fresh loads of the saved page: first contentful paint, the viewer's
scripts done (``masreplay-ready``) and interactive (``masreplay-interactive``: the first frame
after them), read from the page's own Performance API; then input to the next frame for a zoom
button (every mark and edge laid out again) and a ctrl + wheel zoom (the gesture's preview, one
transform; the exact layout follows when the gesture stops). Python's side (``view(...).to_html()``) is timed with
pytest-benchmark. The issue's budget (a 4,000-event trace in under 1 s) is printed beside the
figures as the line they are compared to; nothing is asserted on times.

Needs Debian's Chromium (``apt-get install -y chromium``) and playwright's Python client
(``pip install playwright``).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

import masreplay

# The browser launcher the viewer's tests use (tests/browser.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from browser import chromium

#: Sub-agents per trace for about 40, 400 and 4,000 events (12 events each, on average).
SIZES = {"40": 3, "400": 30, "4,000": 300}
ROUNDS = 5
BUDGET_S = 1.0

ZOOM_STEP = """async () => {
  const started = performance.now();
  document.getElementById("zoom-in").click();
  await new Promise((done) => requestAnimationFrame(() => setTimeout(done)));
  return performance.now() - started;
}"""

WHEEL_FRAME = """async () => {
  const chart = document.getElementById("chart"), box = chart.getBoundingClientRect();
  const wheel = {deltaY: -100, ctrlKey: true, clientX: box.left + 500, clientY: box.top + 50, bubbles: true, cancelable: true};
  const started = performance.now();
  chart.dispatchEvent(new WheelEvent("wheel", wheel));
  await new Promise((done) => requestAnimationFrame(() => setTimeout(done)));
  return performance.now() - started;
}"""

PAGE_TIMES = """() => [
  performance.getEntriesByName("first-contentful-paint")[0].startTime,
  performance.getEntriesByName("masreplay-ready")[0].startTime,
  performance.getEntriesByName("masreplay-interactive")[0].startTime,
]"""


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched


def load_times(browser, path, n: int) -> tuple[float, float, float, float, float]:
    """One fresh load: first contentful paint, scripts done, interactive, a zoom step laid out
    exactly and a wheel-zoom frame (the gesture's preview), in seconds."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(path.as_uri())
    page.wait_for_function(
        "['first-contentful-paint', 'masreplay-interactive'].every((name) => performance.getEntriesByName(name).length)"
    )
    assert page.locator("[data-event-id]").count() == n
    paint, ready, interactive = page.evaluate(PAGE_TIMES)
    zoom = page.evaluate(ZOOM_STEP)
    wheel = page.evaluate(WHEEL_FRAME)
    page.close()
    return paint / 1e3, ready / 1e3, interactive / 1e3, zoom / 1e3, wheel / 1e3


@pytest.mark.parametrize("size", list(SIZES))
def test_render(size, browser, measure, record, dataset_type, tmp_path):
    batch = masreplay.sim.generate(1, agents=SIZES[size], events_per_agent=(10, 14), seed=19)
    n = batch.num_events

    def group(what: str, goal: str = ""):
        return dataset_type(f"viewer, {size}-event trace ({n:,} events): {what}", None, 1, n, 0, goal, suite="view")

    html = measure(
        lambda: masreplay.view(batch, 0, color="advantage").to_html(),
        data=group("the page made in Python"),
        side="masreplay.view(batch, 0, color='advantage').to_html()",
        rounds=ROUNDS,
        unit="ms",
    )
    record(len(html.encode()), data=group("the page made in Python"), side="page size", unit="bytes", ours=False)
    path = tmp_path / "view.html"
    path.write_text(html, encoding="utf-8")
    rounds = [load_times(browser, path, n) for _ in range(ROUNDS)]
    paint, ready, interactive, zoom, wheel = (statistics.median(column) for column in zip(*rounds, strict=True))
    milestones = group("page load in Chromium, medians of fresh loads")
    record(paint, data=milestones, side="first contentful paint", unit="ms", ours=False)
    record(ready, data=milestones, side="viewer scripts done", unit="ms", ours=False)
    against = group("interactive vs the issue's budget", f"< {BUDGET_S:.0f} s at 4,000 events")
    record(interactive, data=against, side="masreplay page interactive (first frame after its scripts)", unit="ms", ours=True)
    record(BUDGET_S, data=against, side="issue 19 budget", unit="ms", ours=False)
    frames = group("pan and zoom, input to next frame")
    record(zoom, data=frames, side="zoom button: every mark and edge laid out again", unit="ms", ours=False)
    record(wheel, data=frames, side="ctrl + wheel: the gesture's preview (one transform)", unit="ms", ours=False)

"""masreplay.view: the page's data and HTML in Python, the command line, and the page itself in
headless Chromium (Debian's package, driven by playwright's Python client)."""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pyarrow as pa
import pytest

import masreplay
from browser import chromium
from masreplay import sim
from masreplay.cli import main
from masreplay.viewer._model import critical_path, lanes


def page_data(html: str) -> dict:
    match = re.search(r'<script id="masreplay-data" type="application/json">(.*?)</script>', html, re.S)
    assert match, "the page embeds its data"
    return json.loads(match.group(1))


@pytest.fixture(scope="module")
def groups() -> masreplay.TraceBatch:
    return sim.generate(8, seed=3)


@pytest.fixture(scope="module")
def branched():
    return sim.branches(2, branches=3, branch_points=2, seed=4)


# ---- the page's data --------------------------------------------------------------------
@pytest.mark.parametrize("shape", [{"seed": 1}, {"agents": (6, 12), "depth": 3, "seed": 2}, {"agents": 40, "seed": 5}])
def test_critical_path_has_metrics_steps_and_follows_edges(shape):
    batch = sim.generate(6, **shape)
    steps = masreplay.metrics(batch)["critical_path_steps"].to_pylist()
    for k, trace in enumerate(batch):
        index = {event["id"]: i for i, event in enumerate(trace["events"])}
        edges = {(index[e["src"]], index[e["dst"]]) for e in trace["edges"]}
        path = critical_path(len(trace["events"]), sorted(edges))
        assert len(path) == steps[k]
        assert all((a, b) in edges for a, b in itertools.pairwise(path))


def test_critical_path_of_edges_out_of_stored_order():
    # 3 -> 0 -> 2 and 1 alone: the longest path is 3 events, found though edges point backwards.
    assert critical_path(4, [(0, 2), (3, 0)]) == [3, 0, 2]
    assert critical_path(1, []) == [0]
    assert critical_path(0, []) == []


def test_lanes_follow_the_spawn_tree():
    batch = sim.generate(1, agents=8, depth=3, fan_out=(1, 3), seed=7)
    trace = batch[0]
    events = trace["events"]
    found = lanes(trace)
    order = found.order
    index = {e["id"]: i for i, e in enumerate(events)}
    pairs = [(index[e["src"]], index[e["dst"]]) for e in trace["edges"]]
    answered = {dst: src for src, dst in pairs if (events[src]["type"], events[dst]["type"]) == ("tool_call", "tool_result")}
    assert answered and set(found.answers.values()) == set(answered)
    for i, event in enumerate(events):
        # A tool result sits in the lane of the agent whose call it answers.
        expected = events[answered[i]]["agent"] if i in answered else event["agent"]
        assert order[found.of_event[i]]["agent"] == expected
    assert order[0]["agent"] == events[0]["agent"] and order[0]["parent"] == -1
    # Every result is answered here, so the lanes are the agents and no tool.
    assert len(answered) == sum(e["type"] == "tool_result" for e in events)
    agents = {e["agent"] for e in events if e["type"] != "tool_result"} | {e["to"] for e in events if e["type"] == "spawn"}
    assert {lane["agent"] for lane in order} == agents
    for i, lane in enumerate(order):
        if lane["parent"] >= 0:
            assert lane["parent"] < i, "a parent's lane comes before its sub-agents'"
            spawns = [e for e in events if e["type"] == "spawn" and e.get("to") == lane["agent"]]
            assert order[lane["parent"]]["agent"] == min(spawns, key=lambda e: e["t"])["agent"]


def test_orchestrator_lane_comes_before_the_human_who_opened_the_trace():
    trace = sim.generate(1, seed=2)[0]
    first = trace["events"][0]
    for event in trace["events"]:
        event["t"] += 1
    trace["events"].insert(0, {"id": "h0", "t": 0, "type": "human_intervention", "agent": "user"})
    trace["edges"].insert(0, {"src": "h0", "dst": first["id"], "type": "causal"})
    trace = masreplay.load_traces([trace])[0]
    assert [lane["agent"] for lane in lanes(trace).order][:1] == [first["agent"]]
    assert lanes(trace).order[-1]["agent"] == "user"


def test_unanswered_tool_results_get_tool_lanes_last():
    trace = sim.generate(1, seed=2)[0]
    trace["edges"] = [e for e in trace["edges"] if e["type"] != "tool_dependency"]
    trace = masreplay.load_traces([trace])[0]
    order = lanes(trace).order
    tools = [lane for lane in order if lane["tool"]]
    assert {lane["agent"] for lane in tools} == {e["agent"] for e in trace["events"] if e["type"] == "tool_result"}
    assert order[-len(tools) :] == tools


def test_page_is_self_contained_and_embeds_the_group(groups):
    page = masreplay.view(groups, 1, color="advantage")
    html = page.to_html()
    assert "http" not in html and "<link" not in html and "src=" not in html
    data = page_data(html)
    group_id = groups.to_arrow()["group_id"].to_pylist()
    siblings = [groups.trace_ids[i] for i, g in enumerate(group_id) if g == group_id[1]]
    assert data["current"] == groups.trace_ids[1] and data["siblings"] == siblings
    expected = masreplay.advantages(groups[[groups.trace_ids.index(s) for s in siblings]], dtype="float64")
    for trace, advantage in zip(data["traces"], expected.per_trace, strict=True):
        assert trace["advantage"] == pytest.approx(advantage)
    assert [len(t["events"]["id"]) for t in data["traces"]] == [
        len(groups[groups.trace_ids.index(s)]["events"]) for s in siblings
    ]
    assert data["scale"]["name"] == "advantage" and data["scale"]["estimator"] == "grpo"
    assert masreplay.view(groups, 1, group=False).data["siblings"] == [groups.trace_ids[1]]


def test_trace_by_id_and_bad_arguments(groups):
    assert masreplay.view(groups, groups.trace_ids[5]).trace_id == groups.trace_ids[5]
    assert masreplay.view(groups, -1).trace_id == groups.trace_ids[-1]
    for bad in ("nope", 8, 2.0):
        with pytest.raises(masreplay.InvalidArgumentError):
            masreplay.view(groups, bad)
    with pytest.raises(masreplay.InvalidArgumentError, match="color 'telepathy'"):
        masreplay.view(groups, 0, color="telepathy")
    with pytest.raises(masreplay.InvalidArgumentError, match="one value per event"):
        masreplay.view(groups, 0, credit=np.zeros(3))
    with pytest.raises(masreplay.InvalidArgumentError, match="lacks"):
        masreplay.view(groups, 0, credit=pa.table({"trace_id": ["x"], "credit": [1.0]}))
    with pytest.raises(masreplay.InvalidArgumentError):
        masreplay.view([groups[0]], 0)


def test_credit_table_counterfactual_and_branches(branched):
    batch = branched.batch
    table = masreplay.counterfactual_credit(batch, aligned=False)
    page = masreplay.view(batch, 0, credit=table, color="counterfactual")
    factual = page.data["traces"][0]
    ids = factual["events"]["id"]
    for row in table.to_pylist():
        if str(row["trace_id"]) == factual["id"]:
            i = ids.index(row["event_id"])
            assert factual["credit"][i] == pytest.approx(row["credit"]) and factual["stderr"][i] == pytest.approx(row["stderr"])
    credited = {ids[i] for i, c in enumerate(factual["credit"]) if c is not None}
    assert credited == {r["event_id"] for r in table.to_pylist() if str(r["trace_id"]) == factual["id"]}
    # Each branch is listed at its branch point; the named colouring finds the same credit.
    points = {(ids[b["event"]], b["trace_id"]) for b in factual["branches"]}
    origins = batch.to_arrow()["counterfactual_of"].to_pylist()
    assert points == {(o["event_id"], batch.trace_ids[i]) for i, o in enumerate(origins) if o and o["trace_id"] == factual["id"]}
    named = masreplay.view(batch, 0, color="counterfactual").data["traces"][0]
    assert named["credit"] == factual["credit"]


def test_named_colourings(groups):
    shapley = masreplay.view(groups, 0, color="shapley").data
    assert "precedence" in shapley["scale"]["estimator"] and "evaluations" in shapley["scale"]["budget"]
    trace = shapley["traces"][0]
    # An agent's Shapley value is shared equally among its events.
    by_lane: dict[int, set] = {}
    for lane, credit in zip(trace["events"]["lane"], trace["credit"], strict=True):
        by_lane.setdefault(lane, set()).add(credit)
    assert all(len(values) == 1 for values in by_lane.values())
    tokens = masreplay.view(groups, 0, color="tokens").data["traces"][0]
    assert tokens["credit"] == [float(t) for t in tokens["events"]["tokens"]]
    process = masreplay.view(groups, 0, color="process").data["traces"][0]
    assert [c is None for c in process["credit"]] == ["process" not in (e.get("reward") or {}) for e in groups[0]["events"]]


def test_trace_credit_stderr_is_the_players_over_its_events(groups):
    sample = groups[[0, 1]]

    def value(trace_index, masks):
        return masks.sum(axis=1) ** 1.5

    credit = masreplay.trace_shapley(sample, value, method="permutation", budget=200, respect_spawn_tree=False)
    data = masreplay.view(sample, 0, credit=credit, group=False).data
    players = credit.players.filter(pa.compute.equal(credit.players["trace_index"], 0)).to_pylist()
    trace = data["traces"][0]
    labels = {p["label"]: p for p in players}
    for i, agent in enumerate(e["agent"] for e in sample[0]["events"]):
        if agent in labels:
            p = labels[agent]
            assert trace["stderr"][i] == pytest.approx(p["stderr"] / p["n_events"])


def test_html_in_attributes_cannot_end_the_script():
    trace = sim.generate(1, seed=2)[0]
    trace["events"][0]["note"] = "</script><script>window.pwned = 1</script>"
    html = masreplay.view(masreplay.load_traces([trace]), 0).to_html()
    assert html.count("</script>") == 2
    assert page_data(html)["traces"][0]["details"][0]["note"] == trace["events"][0]["note"]


#: Text that would break a page built by plain string replacement: a script end, a comment
#: opening that puts the HTML parser in its escaped states, and the template's own slots.
HOSTILE = "<!--<script></script><img src=x onerror=window.pwned=1>/*masreplay:js*/ masreplay:title &amp;"


def hostile_trace() -> masreplay.TraceBatch:
    trace = sim.generate(1, seed=2)[0]
    for event in trace["events"]:
        event["agent"] += HOSTILE
        event["content_ref"] = HOSTILE
        for key in ("from", "to"):
            if event.get(key):
                event[key] += HOSTILE
    trace["events"][1]["note"] = HOSTILE
    return masreplay.load_traces([trace])


def test_trace_text_cannot_reach_the_markup_or_the_template_slots():
    page = masreplay.view(hostile_trace(), 0)
    html = page.to_html()
    assert html.count("<script") == 2 and html.count("</script>") == 2 and "<!--" not in html
    assert page_data(html) == json.loads(json.dumps(page.data))  # every text back unchanged
    assert html.count("function ") == masreplay.view(sim.generate(1, seed=2), 0).to_html().count("function ")


def test_save_and_repr_html(groups, tmp_path):
    page = masreplay.view(groups, 0)
    page.save(tmp_path / "page.html")
    assert (tmp_path / "page.html").read_text(encoding="utf-8") == page.to_html()
    assert page._repr_html_().startswith("<iframe srcdoc=") and "&lt;script" in page._repr_html_()


def test_cli_view(groups, tmp_path, capsys):
    source = tmp_path / "traces.parquet"
    groups.write_parquet(source)
    out = tmp_path / "out.html"
    assert main(["view", str(source), "--trace", groups.trace_ids[2], "--color", "advantage", "-o", str(out)]) == 0
    data = page_data(out.read_text(encoding="utf-8"))
    assert data["current"] == groups.trace_ids[2] and data["scale"]["name"] == "advantage"
    assert main(["view", str(source), "--color", "telepathy", "-o", str(out)]) == 1
    assert "telepathy" in capsys.readouterr().err
    assert main(["view", str(tmp_path / "missing.json")]) == 1
    assert main(["view", str(source), "--trace", "nope"]) == 1


# ---- the page in a browser --------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched


class Opened:
    """A page loaded from a file, with every console error and every request it made."""

    def __init__(self, browser, page_view, path) -> None:
        page_view.save(path)
        self.url = path.as_uri()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.page.on("console", lambda message: self.errors.append(message.text) if message.type == "error" else None)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.goto(self.url)
        self.page.wait_for_selector("body[data-ready=true]")

    def marks(self):
        return self.page.locator("[data-event-id]")

    def field(self, name: str) -> str:
        return self.page.locator(f'#details [data-field="{name}"]').inner_text()


def test_browser_page_contract(browser, groups, tmp_path):
    credit = np.linspace(-1.0, 1.0, groups.num_events)
    opened = Opened(browser, masreplay.view(groups, 0, credit=credit, color="demo"), tmp_path / "view.html")
    page, trace = opened.page, groups[0]
    assert opened.errors == [] and opened.requests == [opened.url]
    assert opened.marks().count() == len(trace["events"])
    assert opened.marks().evaluate_all("marks => marks.map(m => m.dataset.eventId)") == [e["id"] for e in trace["events"]]
    steps = masreplay.metrics(groups)["critical_path_steps"][0].as_py()
    assert page.locator('[data-critical="true"]').count() == steps
    # Clicking an event shows its id, agent and credit.
    event = trace["events"][4]
    page.locator(f'[data-event-id="{event["id"]}"]').dispatch_event("click")
    assert opened.field("id") == event["id"] and opened.field("agent") == event["agent"]
    assert float(opened.field("credit").split()[0]) == credit[4]
    page.screenshot(path=tmp_path / "view.png")
    assert (tmp_path / "view.png").stat().st_size > 10_000


def rgb(fill: str) -> tuple[int, int, int]:
    return tuple(int(v) for v in re.findall(r"\d+", fill))  # type: ignore[return-value]


def test_browser_colours_follow_credit_sign_and_scale(browser, groups, tmp_path):
    n = len(groups[0]["events"])
    values = np.full(groups.num_events, np.nan)
    values[:n] = np.linspace(-2.0, 2.0, n)
    values[1] = np.nan  # uncredited
    opened = Opened(browser, masreplay.view(groups, 0, credit=values), tmp_path / "colours.html")
    marks = opened.marks().evaluate_all("marks => marks.map(m => [m.dataset.credit ?? null, m.getAttribute('fill')])")
    assert marks[1] == [None, "rgb(168, 168, 168)"]
    neutral = np.array([240, 240, 240])
    distance = []
    for i, (credit, fill) in enumerate(marks):
        if i == 1:
            continue
        assert float(credit) == pytest.approx(values[i])
        r, g, b = rgb(fill)
        if values[i] > 0.05:
            assert r > b
        elif values[i] < -0.05:
            assert b > r
        distance.append((abs(values[i]), np.abs(np.array([r, g, b]) - neutral).sum()))
    distance.sort()
    assert all(a[1] <= b[1] + 3 for a, b in itertools.pairwise(distance)), "farther from 0, farther from neutral"
    assert distance[-1][1] > 300, "the largest |credit| takes the full colour"


def test_browser_low_confidence_marks(browser, branched, tmp_path):
    table = masreplay.counterfactual_credit(branched.batch)
    opened = Opened(browser, masreplay.view(branched.batch, 0, credit=table), tmp_path / "low.html")
    rows = [r for r in table.to_pylist() if str(r["trace_id"]) == branched.batch.trace_ids[0] and r["credit"] == r["credit"]]
    low = {r["event_id"] for r in rows if abs(r["credit"]) < 2 * r["stderr"]}
    found = set(opened.page.locator('[data-low-confidence="true"]').evaluate_all("marks => marks.map(m => m.dataset.eventId)"))
    assert found == low and len(rows) > 0


def test_browser_switch_to_sibling_and_branch(browser, branched, tmp_path):
    batch = branched.batch
    opened = Opened(browser, masreplay.view(batch, 0, color="counterfactual"), tmp_path / "group.html")
    page = opened.page
    siblings = page.locator(".sibling")
    assert siblings.count() == 2
    other = batch.trace_ids.index(siblings.nth(1).get_attribute("data-trace-id"))
    siblings.nth(1).click()
    assert page.locator("#trace-title").get_attribute("data-trace-id") == batch.trace_ids[other]
    assert opened.marks().count() == len(batch[other]["events"])
    assert page.locator(".sibling.current").get_attribute("data-trace-id") == batch.trace_ids[other]
    # Back to the first trace, then to one of its branches from the branch list.
    siblings.nth(0).click()
    branch = page.locator("#branches .branch").first
    target = branch.get_attribute("data-switch")
    branch.click()
    assert opened.marks().count() == len(batch[batch.trace_ids.index(target)]["events"])
    assert opened.errors == []


def test_browser_filters_search_fold_and_agent_summary(browser, groups, tmp_path):
    opened = Opened(browser, masreplay.view(groups, 0, color="tokens"), tmp_path / "filters.html")
    page, events = opened.page, groups[0]["events"]
    page.select_option("#filter-type", "tool_call")
    dimmed = opened.marks().evaluate_all("marks => marks.map(m => m.classList.contains('filtered'))")
    assert dimmed == [e["type"] != "tool_call" for e in events]
    page.select_option("#filter-type", "")
    page.fill("#search", events[5]["id"])
    page.press("#search", "Enter")
    assert opened.field("id") == events[5]["id"]
    labels = page.locator(".lane-label").count()
    page.locator(".fold").first.dispatch_event("click")
    assert page.locator(".lane-label").count() < labels and opened.marks().count() == len(events)
    page.locator(".fold").first.dispatch_event("click")
    data = masreplay.view(groups, 0).data["traces"][0]
    shown_results = 0
    for lane, agent in enumerate(lane["agent"] for lane in data["lanes"]):
        page.locator(f'.lane-label[data-lane="{lane}"]').dispatch_event("click")
        own = [e for e in events if e["agent"] == agent]
        results = sum(1 for i, e in enumerate(events) if data["events"]["lane"][i] == lane and e["agent"] != agent)
        assert (opened.field("agent"), opened.field("events"), opened.field("tool results")) == (
            agent,
            str(len(own)),
            str(results),
        )
        assert opened.field("tokens") == str(sum(e.get("tokens") or 0 for e in own))
        shown_results += results
    assert shown_results == sum(e["type"] == "tool_result" for e in events) > 0
    steps = masreplay.metrics(groups)["critical_path_steps"][0].as_py()
    assert page.locator("#metrics [data-metric=critical_path_steps]").inner_text() == str(steps)
    assert opened.errors == []


def test_browser_zoom_and_pan_move_marks_and_keep_them(browser, groups, tmp_path):
    opened = Opened(browser, masreplay.view(groups, 0), tmp_path / "zoom.html")
    page, events = opened.page, groups[0]["events"]
    longest = max(range(len(events)), key=lambda i: events[i].get("duration_s") or 0)
    mark = page.locator(f'[data-event-id="{events[longest]["id"]}"]')
    width = float(mark.get_attribute("width"))
    page.click("#zoom-in")
    page.wait_for_timeout(50)
    assert float(mark.get_attribute("width")) == pytest.approx(1.5 * width, abs=0.2)
    x = float(mark.get_attribute("x"))
    box = page.locator("#chart").bounding_box()
    start = (box["x"] + box["width"] - 40, box["y"] + box["height"] - 20)  # below the lanes: no mark there
    page.mouse.move(*start)
    page.mouse.down()
    page.mouse.move(start[0] - 120, start[1], steps=4)
    page.mouse.up()
    assert float(mark.get_attribute("x")) == pytest.approx(x - 120, abs=0.5)
    assert page.locator(".moving").get_attribute("transform") is None
    # Ctrl + wheel previews the zoom as one transform, then lays out exactly.
    page.mouse.move(box["x"] + 400, box["y"] + 10)
    page.keyboard.down("Control")
    page.mouse.wheel(0, -200)
    page.keyboard.up("Control")
    page.wait_for_function("!document.querySelector('.moving').hasAttribute('transform')")
    assert float(mark.get_attribute("width")) > 1.5 * width * 1.2
    assert opened.marks().count() == len(events) and opened.errors == []


def test_browser_kimi_scale_trace(browser, tmp_path):
    batch = sim.generate(1, agents=300, events_per_agent=(10, 14))
    opened = Opened(browser, masreplay.view(batch, 0, color="shapley"), tmp_path / "kimi.html")
    assert opened.marks().count() == batch.num_events
    assert opened.page.locator('[data-critical="true"]').count() == masreplay.metrics(batch)["critical_path_steps"][0].as_py()
    assert opened.errors == []
    opened.page.screenshot(path=tmp_path / "kimi.png")


def test_browser_draws_a_trace_of_hostile_text_as_text(browser, tmp_path):
    batch = hostile_trace()
    opened = Opened(browser, masreplay.view(batch, 0), tmp_path / "hostile.html")
    assert opened.errors == [] and opened.requests == [opened.url]
    assert opened.marks().count() == len(batch[0]["events"])
    assert opened.page.evaluate("window.pwned === undefined")
    event = batch[0]["events"][1]
    opened.page.locator(f'[data-event-id="{event["id"]}"]').dispatch_event("click")
    assert opened.field("agent") == event["agent"]

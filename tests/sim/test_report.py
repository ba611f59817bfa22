"""The HTML report of sim/report.py: self-contained, every section present, numbers from the summaries."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

from corral.sim.metrics import Measures
from corral.sim.report import measures_table, write_report
from corral.sim.report_plots import coarsen, time_unit
from corral.sim.report_series import Series
from tests.sim.test_metrics import SCENARIO_A, SCENARIO_B, synthetic_events

SECTIONS = [
    "key-measures",
    "queue-length-and-gpu-utilisation",
    "job-completion-time",
    "queues-share-of-the-cluster-over-time",
    "queues-share-of-gpu-hours-against-weight-and-quota",
    "topology",
    "all-measures-json",
]


def runs() -> dict[str, tuple[dict[str, object], Series]]:
    out = {}
    for name, events in (("fifo", SCENARIO_A), ("fair share", synthetic_events(500, seed=4))):
        m = Measures().feed_all(events)
        out[name] = (m.summary(), m.series())
    return out


def test_a_report_has_every_section_and_needs_nothing_online(tmp_path: Path) -> None:
    page = write_report(tmp_path / "out", runs(), title="Two <policies>")
    text = page.read_text()
    assert page.name == "index.html" and "<title>Two &lt;policies&gt;</title>" in text
    for section in SECTIONS:
        assert f'<section id="{section}">' in text
    assert not re.search(r"<script|<link|(src|href)=\"https?:", text)
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    assert len(images) == 4  # timelines, JCT CDF, queue shares, topology
    assert all(base64.b64decode(png).startswith(b"\x89PNG") for png in images)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["fifo"]["jct"]["mean"] == 70.0


def test_the_table_prints_the_summary_and_marks_the_best() -> None:
    table = measures_table(runs())
    assert re.search(r"<th>.*fifo</th><th>.*fair share</th>", table)
    assert "70.0 s" in table  # scenario A's mean JCT
    assert "47.5%" in table  # scenario A's utilisation
    assert table.count("<b>") > 3


def test_a_report_of_runs_with_nothing_to_plot(tmp_path: Path) -> None:
    m = Measures().feed_all(SCENARIO_B[:3])  # one job started, nothing finished
    text = write_report(tmp_path, {"only": (m.summary(), m.series())}).read_text()
    assert "Nothing to plot." in text  # no finished job: no JCT CDF
    assert text.count("data:image/png") == 3
    assert "Nothing to plot." in write_report(tmp_path / "empty", {}).read_text()


def test_coarsening_keeps_the_area_under_a_series() -> None:
    t = [float(i) for i in range(1001)]
    values = [float(i % 7) for i in range(1001)]
    ct, cv = coarsen(t, values, points=50)
    assert len(ct) == len(cv) <= 52 and ct[0] == 0.0 and ct[-1] == 1000.0 and cv[-1] == values[-1]
    area = sum(v * (b - a) for v, a, b in zip(values, t, t[1:], strict=False))
    assert sum(v * (b - a) for v, a, b in zip(cv, ct, ct[1:], strict=False)) == area


def test_time_units() -> None:
    assert time_unit(30) == (1.0, "seconds")
    assert time_unit(3 * 3600) == (3600.0, "hours")
    assert time_unit(10 * 86400) == (86400.0, "days")

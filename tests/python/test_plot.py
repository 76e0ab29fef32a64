"""reshard.plot over `reshard_plan --json` files: the panel's scenarios
(scripts/panel.sh, parsed from its table) at a reduced size, each planned
and priced by the tool, checked field by field and drawn headless to a PNG;
and files that are not valid descriptions, refused naming the field.

The tool is RESHARD_PLAN if set, else build/tools/reshard_plan of this
checkout (scripts/test.sh builds it first); without it the scenario tests
skip. Drawing needs matplotlib (the package's "plot" and "test" extras)."""
import copy
import json
import os
import re
import subprocess

import pytest

from reshard import plot

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAN = os.environ.get("RESHARD_PLAN") or os.path.join(REPO, "build", "tools", "reshard_plan")
HAVE_PLAN = os.path.isfile(PLAN) and os.access(PLAN, os.X_OK)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def panel_scenarios():
    """name, config, train, infer, topology and extra options of each row
    of scripts/panel.sh's scenarios=( ... ) table."""
    text = open(os.path.join(REPO, "scripts", "panel.sh")).read()
    m = re.search(r"^scenarios=\((.*?)^\)", text, re.S | re.M)
    rows = re.findall(r'^\s*"([^"]*)"\s*$', m.group(1), re.M) if m else []
    out = []
    for row in rows:
        f = row.split("|")
        out.append(dict(name=f[0], config=f[1], train=f[2], infer=f[3], topology=f[4],
                        args=f[6].split() if len(f) > 6 else []))
    return out


def _spec(s):
    return dict(kv.split("=", 1) for kv in s.split(","))


def _unspec(d):
    return ",".join("%s=%s" % kv for kv in d.items())


def reduced(sc):
    """The scenario at a size a test can plan in a second: at most 2
    pipeline stages of 2 layers each (no uneven first/last stage), data
    parallelism at most 4 on each side, expert parallelism cut to fit;
    tensor parallelism, the model's shapes, the topology and the extra
    options as published."""
    # a framework prefix (sglang:, fsdp:) stays in front of the spec
    iframe, _, ispec = sc["infer"].rpartition(":")
    t, i = _spec(sc["train"]), _spec(ispec)
    t.pop("first", None)
    t.pop("last", None)
    tp, pp = int(t.get("tp", 1)), min(int(t.get("pp", 1)), 2)
    dp = min(int(t.get("dp", 1)), 4)
    t["pp"], t["dp"] = str(pp), str(dp)
    if "ep" in t:
        etp = int(t.get("etp", tp))
        t["ep"] = str(max(1, min(int(t["ep"]), tp * dp // etp)))
    itp, idp = int(i.get("tp", 1)), min(int(i.get("dp", 1)), 4)
    i["dp"] = str(idp)
    if "ep" in i:
        i["ep"] = str(min(int(i["ep"]), itp * idp))
    return ["--model-config", os.path.join(REPO, "configs", sc["config"]), "--layers", str(2 * pp),
            "--train", _unspec(t), "--infer", (iframe + ":" if iframe else "") + _unspec(i),
            "--topology", sc["topology"]] + sc["args"]


SCENARIOS = panel_scenarios()


def test_panel_table_parsed():
    assert len(SCENARIOS) >= 5, "scripts/panel.sh's scenarios=( ... ) table not found or changed shape"
    for sc in SCENARIOS:
        assert os.path.isfile(os.path.join(REPO, "configs", sc["config"])), sc


def run_plan(args, json_path):
    r = subprocess.run([PLAN, "--no-check", "--json", str(json_path)] + args, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, "reshard_plan %s\n%s\n%s" % (" ".join(args), r.stdout[-2000:], r.stderr[-2000:])
    return r.stdout


def check_doc(doc, stdout, topology):
    """The fields reshard.plot draws from, against the tool's own stdout."""
    world = doc["world"]
    assert len(doc["ranks"]) == world == doc["sources"] + doc["destinations"]
    assert {r["role"] for r in doc["ranks"]} <= {"src", "dst", "both", "none"}
    assert all(r["node"] is not None and r["domain"] is not None for r in doc["ranks"])
    assert doc["topology"]["name"] == topology
    m = plot.traffic_matrix(doc)
    assert sum(map(sum, m)) == doc["totals"]["send_bytes"] == sum(r["send_bytes"] for r in doc["ranks"])
    assert sum(r["bytes"] for r in doc["rounds"]) == doc["totals"]["send_bytes"]
    for p in doc["pairs"]:
        assert p["link"] in ("nic", "nvlink") and p["forward_bytes"] <= p["bytes"]
        assert p["phase"] == -1 or 0 <= p["phase"] < doc["phases"]["count"]
    est = doc["estimate"]
    res = re.search(r"^# reshard_plan: predicted_s=(\S+) lower_s=(\S+)", stdout, re.M)
    assert res and "%.6g" % est["predicted_s"] == res.group(1) and "%.6g" % est["lower_s"] == res.group(2)
    assert est["predicted_s"] >= est["lower_s"] > 0
    pre = doc["spreading"]["pre_plan_s"] if doc["spreading"] else 0.0
    pre += doc["gathering"]["pre_plan_s"] if doc.get("gathering") else 0.0
    assert sum(r["seconds"] for r in doc["rounds"]) + pre == pytest.approx(est["predicted_s"], rel=1e-9)
    loads = plot.link_loads(doc)
    assert len(loads) == len(doc["rounds"])
    for r in loads:
        for kind in ("nic", "nvlink"):
            if r[kind]:
                assert r[kind]["seconds"] <= r["seconds"] * (1 + 1e-12)
                assert r[kind]["bytes"] >= 0 and 0 <= r[kind]["rank"] < world
    assert set(doc["baselines"]) == {"gather-broadcast", "replica0-direct", "balanced-direct"}


@pytest.mark.skipif(not HAVE_PLAN, reason="reshard_plan not built (%s; set RESHARD_PLAN)" % PLAN)
@pytest.mark.parametrize("sc", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_panel_scenario_drawn(sc, tmp_path):
    pytest.importorskip("matplotlib")
    js, png = tmp_path / "plan.json", tmp_path / "plan.png"
    stdout = run_plan(reduced(sc), js)
    doc = plot.load(str(js))
    check_doc(doc, stdout, sc["topology"])
    assert plot.main([str(js), "-o", str(png), "--dpi", "50"]) == 0
    data = png.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 15000, "a PNG of %d bytes: nearly empty" % len(data)


@pytest.mark.skipif(not HAVE_PLAN, reason="reshard_plan not built (%s; set RESHARD_PLAN)" % PLAN)
def test_no_topology_drawn(tmp_path):
    """Without --topology: no links, no estimate; still a picture."""
    pytest.importorskip("matplotlib")
    js, png = tmp_path / "plan.json", tmp_path / "plan.png"
    run_plan(["--shape", "256,192", "--src-mesh", "4", "--src-placements", "S0", "--dst-mesh", "2,2",
              "--dst-placements", "R,S1"], js)
    doc = plot.load(str(js))
    assert doc["topology"] is None and doc["estimate"] is None and plot.link_loads(doc) is None
    assert all(r["links"] is None for r in doc["rounds"])
    plot.render(doc, str(png), dpi=50)
    assert png.read_bytes()[:8] == PNG_MAGIC


# ---- malformed files ----

def minimal_doc():
    """A small valid description, as the tool writes one without a topology."""
    return {
        "schema": "reshard-plan", "version": 1, "description": "test", "world": 2, "sources": 1,
        "destinations": 1, "phases": {"count": 1, "wide_bytes": 0, "pace_rounds": 0, "estimates": []},
        "topology": None, "estimate": None, "baselines": None, "spreading": None,
        "totals": {"send_bytes": 8},
        "ranks": [{"rank": 0, "role": "src"}, {"rank": 1, "role": "dst"}],
        "pairs": [{"src": 0, "dst": 1, "bytes": 8, "messages": 1, "forward_bytes": 0, "link": None, "phase": 0}],
        "rounds": [{"round": 0, "bytes": 8, "messages": 1, "phase": 0, "seconds": None, "bound": None,
                    "bound_where": None, "links": None}],
    }


def test_minimal_doc_valid():
    plot.validate(minimal_doc())


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("rounds"), "rounds"),
    (lambda d: d["rounds"][0].update(bytes="8"), "rounds[0].bytes"),
    (lambda d: d["pairs"][0].update(dst=2), "pairs[0].dst"),
    (lambda d: d["pairs"][0].pop("bytes"), "pairs[0].bytes"),
    (lambda d: d.update(schema="something-else"), "schema"),
    (lambda d: d.update(version=2), "version"),
    (lambda d: d["ranks"].pop(), "ranks"),
    (lambda d: d["ranks"][1].update(role=None), "ranks[1].role"),
    (lambda d: d["phases"].pop("count"), "phases.count"),
    (lambda d: d.update(estimate={"predicted_s": 1.0}), "estimate.lower_s"),
    (lambda d: d["rounds"][0].update(links={"nic-egress": None}), "rounds[0].links"),
])
def test_malformed_names_the_field(mutate, field, tmp_path, capsys):
    d = copy.deepcopy(minimal_doc())
    mutate(d)
    with pytest.raises(plot.PlanFileError) as e:
        plot.validate(d)
    assert e.value.field == field and field in str(e.value)
    js = tmp_path / "bad.json"
    js.write_text(json.dumps(d))
    assert plot.main([str(js), "-o", str(tmp_path / "x.png")]) == 1
    assert field in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_not_json(tmp_path, capsys):
    js = tmp_path / "bad.json"
    js.write_text('{"schema": "reshard-plan", ')
    with pytest.raises(plot.PlanFileError, match="not JSON"):
        plot.load(str(js))
    assert plot.main([str(js), "-o", str(tmp_path / "x.png")]) == 1
    assert "not JSON" in capsys.readouterr().err

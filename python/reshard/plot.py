"""A picture of a plan: draws the file `reshard_plan --json FILE` writes
(schema: tools/README.md, "reshard_plan --json").

    python -m reshard.plot plan.json -o plan.png

Four panels: the rank x rank traffic matrix (bytes each sender sends each
receiver), the load of the busiest NIC and of the busiest NVLink in each
round against the link's bandwidth (with --topology; the cost model's own
terms, as the tool wrote them), and the bytes of each round coloured by its
phase. The title carries the prediction, T_lower and the baselines.

Pure Python over the JSON file: nothing here plans or prices. matplotlib is
an optional dependency (pip install "reshard[plot]"), imported only when a
picture is drawn, on the Agg canvas (no display needed).
"""
import argparse
import json
import math
import sys

__all__ = ["PlanFileError", "load", "validate", "traffic_matrix", "link_loads", "render", "main"]

SCHEMA = "reshard-plan"
VERSION = 1
LINKS = ("nic-egress", "nic-ingress", "nvlink-egress", "nvlink-ingress", "local-copy")


class PlanFileError(ValueError):
    """A file that is not a valid `reshard_plan --json` description; the
    message names the field (e.g. ``rounds[3].bytes``)."""

    def __init__(self, field, problem):
        self.field = field
        super().__init__("%s: %s" % (field, problem))


def _get(obj, key, where):
    if not isinstance(obj, dict):
        raise PlanFileError(where, "expected an object, got %s" % type(obj).__name__)
    if key not in obj:
        raise PlanFileError("%s.%s" % (where, key) if where else key, "missing")
    return obj[key]


def _num(obj, key, where, *, null=False, integer=False, minimum=None):
    name = "%s.%s" % (where, key) if where else key
    v = _get(obj, key, where)
    if v is None and null:
        return None
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if not ok or isinstance(v, bool) or (isinstance(v, float) and not math.isfinite(v)):
        raise PlanFileError(name, "expected %s%s, got %r" % ("an integer" if integer else "a number",
                                                            " or null" if null else "", v))
    if minimum is not None and v < minimum:
        raise PlanFileError(name, "expected >= %s, got %r" % (minimum, v))
    return v


def _list(obj, key, where):
    v = _get(obj, key, where)
    if not isinstance(v, list):
        raise PlanFileError(key if not where else "%s.%s" % (where, key), "expected a list")
    return v


def _validate_rounds(doc, has_topology):
    for i, r in enumerate(_list(doc, "rounds", "")):
        w = "rounds[%d]" % i
        _num(r, "round", w, integer=True, minimum=0)
        _num(r, "bytes", w, integer=True, minimum=0)
        _num(r, "phase", w, integer=True, minimum=0)
        links = _get(r, "links", w)
        if links is None:
            continue
        if not has_topology:
            raise PlanFileError(w + ".links", "link loads without a topology")
        _num(r, "seconds", w, minimum=0)
        for name in LINKS:
            l = _get(links, name, w + ".links")
            if l is not None:
                lw = "%s.links.%s" % (w, name)
                _num(l, "seconds", lw, minimum=0)
                _num(l, "bytes", lw, minimum=0)
                _num(l, "rank", lw, integer=True, minimum=0)


def validate(doc):
    """Checks the fields this module draws from; raises PlanFileError
    naming the first bad one. Returns doc."""
    if not isinstance(doc, dict):
        raise PlanFileError("(top level)", "expected an object")
    if _get(doc, "schema", "") != SCHEMA:
        raise PlanFileError("schema", "expected %r, got %r" % (SCHEMA, doc["schema"]))
    if _num(doc, "version", "", integer=True) != VERSION:
        raise PlanFileError("version", "this reader knows version %d, got %r" % (VERSION, doc["version"]))
    world = _num(doc, "world", "", integer=True, minimum=1)
    ranks = _list(doc, "ranks", "")
    if len(ranks) != world:
        raise PlanFileError("ranks", "%d entries for a world of %d" % (len(ranks), world))
    for i, r in enumerate(ranks):
        if _num(r, "rank", "ranks[%d]" % i, integer=True) != i:
            raise PlanFileError("ranks[%d].rank" % i, "expected %d" % i)
        if not isinstance(_get(r, "role", "ranks[%d]" % i), str):
            raise PlanFileError("ranks[%d].role" % i, "expected a string")
    for i, p in enumerate(_list(doc, "pairs", "")):
        w = "pairs[%d]" % i
        for k in ("src", "dst"):
            if _num(p, k, w, integer=True, minimum=0) >= world:
                raise PlanFileError("%s.%s" % (w, k), "rank %d outside the world of %d" % (p[k], world))
        _num(p, "bytes", w, integer=True, minimum=0)
    phases = _get(doc, "phases", "")
    _num(phases, "count", "phases", integer=True, minimum=1)
    topo = _get(doc, "topology", "")
    if topo is not None:
        _num(topo, "nic_bytes_per_s", "topology", minimum=0)
        _num(topo, "nvlink_bytes_per_s", "topology", minimum=0)
    est = _get(doc, "estimate", "")
    if est is not None:
        _num(est, "predicted_s", "estimate", minimum=0)
        _num(est, "lower_s", "estimate", minimum=0)
    _validate_rounds(doc, topo is not None)
    return doc


def load(path):
    """Reads and validates a `reshard_plan --json` file."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise PlanFileError("(file)", "not JSON: %s" % e) from None
    return validate(doc)


def traffic_matrix(doc):
    """world x world list of lists: bytes sender -> receiver."""
    n = doc["world"]
    m = [[0] * n for _ in range(n)]
    for p in doc["pairs"]:
        m[p["src"]][p["dst"]] += p["bytes"]
    return m


def link_loads(doc):
    """Per round (None without a topology): the round's seconds and, for
    the busiest NIC and the busiest NVLink direction (by the cost model's
    time), its rank, seconds and bytes (None where the round uses none)."""
    if doc["topology"] is None:
        return None
    out = []
    for r in doc["rounds"]:
        links = r["links"] or {}
        row = {"round": r["round"], "seconds": r["seconds"]}
        for kind, names in (("nic", LINKS[0:2]), ("nvlink", LINKS[2:4])):
            best = None
            for name in names:
                l = links.get(name)
                if l is not None and (best is None or l["seconds"] > best["seconds"]):
                    best = dict(l, link=name)
            row[kind] = best
        out.append(row)
    return out


def _title(doc):
    t = doc.get("description") or "reshard plan"
    est = doc.get("estimate")
    if est:
        t += "\npredicted %.4g s, T_lower %.4g s (x%.2f)" % (est["predicted_s"], est["lower_s"],
                                                              est["predicted_s"] / est["lower_s"]
                                                              if est["lower_s"] else float("inf"))
        base = doc.get("baselines") or {}
        if base:
            t += "; " + ", ".join("%s %.3g s" % (k, v) for k, v in base.items() if v is not None)
    return t


def _draw_matrix(fig, ax, doc):
    from matplotlib.colors import LogNorm
    m = traffic_matrix(doc)
    n = doc["world"]
    vals = [v for row in m for v in row if v > 0]
    masked = [[v if v > 0 else float("nan") for v in row] for row in m]
    norm = LogNorm(vmin=min(vals), vmax=max(vals)) if vals and min(vals) < max(vals) else None
    im = ax.imshow(masked, norm=norm, cmap="viridis", interpolation="nearest", aspect="auto")
    fig.colorbar(im, ax=ax, label="bytes")
    roles = [r["role"] for r in doc["ranks"]]
    for i in range(1, n):  # where the sides change
        if roles[i] != roles[i - 1]:
            ax.axhline(i - 0.5, color="red", lw=0.8)
            ax.axvline(i - 0.5, color="red", lw=0.8)
    ax.set_xlabel("receiver rank")
    ax.set_ylabel("sender rank")
    ax.set_title("traffic (%d pairs, %.4g GiB)" % (len(doc["pairs"]), sum(vals) / 2**30))


def _draw_link(ax, doc, loads, kind, limit_key):
    from matplotlib.ticker import MaxNLocator
    topo = doc["topology"]
    limit = topo[limit_key] / 1e9
    xs = [r["round"] for r in loads]
    rate = [(r[kind]["bytes"] / r["seconds"] / 1e9) if r[kind] and r["seconds"] else 0.0 for r in loads]
    busy = [(r[kind]["seconds"] / r["seconds"]) if r[kind] and r["seconds"] else 0.0 for r in loads]
    ax.bar(xs, rate, width=1.0, color="tab:blue" if kind == "nic" else "tab:green",
           label="busiest %s: bytes / round time" % ("NIC" if kind == "nic" else "NVLink"))
    ax.axhline(limit, color="red", ls="--", label="limit %.4g GB/s per rank" % limit)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("GB/s")
    ax.set_ylim(0, limit * 1.15 if limit > 0 else None)
    used = sum(1 for b in busy if b > 0)
    bound = sum(1 for r in loads if r[kind] and r[kind]["seconds"] >= r["seconds"])
    ax.set_title("busiest %s per round (%s): used in %d rounds, bounds %d" %
                 ("NIC" if kind == "nic" else "NVLink", topo.get("name", "?"), used, bound))
    ax.legend(loc="lower right", fontsize="small")


def _draw_phases(ax, doc):
    import matplotlib
    from matplotlib.ticker import MaxNLocator
    ph = doc["phases"]
    P = ph["count"]
    rounds = doc["rounds"]
    cmap = matplotlib.colormaps["tab20"] if hasattr(matplotlib, "colormaps") else matplotlib.cm.get_cmap("tab20")
    colors = [cmap(r["phase"] % 20) for r in rounds]
    ax.bar([r["round"] for r in rounds], [r["bytes"] / 2**20 for r in rounds], width=1.0, color=colors)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("MiB sent (all ranks)")
    t = "%d phase%s (colour: round mod %d)" % (P, "" if P == 1 else "s", P)
    if ph.get("wide_bytes"):
        t += "\nstreams over %.0f MiB send every round" % (ph["wide_bytes"] / 2**20)
    if ph.get("pace_rounds"):
        t += ", paced over %d rounds" % ph["pace_rounds"]
    sp = doc.get("spreading")
    if sp:
        t += "\nafter a source-side spreading pre-plan of %.3g s (not drawn)" % sp["pre_plan_s"]
    ga = doc.get("gathering")
    if ga:
        t += "\nafter an fp8 gathering pre-plan of %.3g s (not drawn)" % ga["pre_plan_s"]
    ax.set_title(t, fontsize="medium")


def render(doc, out, dpi=100):
    """Draws doc (a validated dict, or a path) into the image file out
    (its suffix picks the format: .png, .svg, .pdf)."""
    if not isinstance(doc, dict):
        doc = load(doc)
    else:
        validate(doc)
    from matplotlib.figure import Figure  # lazily: an optional dependency
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    loads = link_loads(doc)
    fig = Figure(figsize=(14, 10), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2)
    _draw_matrix(fig, axes[0][0], doc)
    if loads is not None:
        _draw_link(axes[0][1], doc, loads, "nic", "nic_bytes_per_s")
        _draw_link(axes[1][0], doc, loads, "nvlink", "nvlink_bytes_per_s")
    else:
        for ax in (axes[0][1], axes[1][0]):
            ax.text(0.5, 0.5, "no topology (reshard_plan --topology PRESET):\nno link loads", ha="center",
                    va="center", transform=ax.transAxes)
            ax.set_axis_off()
    _draw_phases(axes[1][1], doc)
    fig.suptitle(_title(doc), fontsize="medium")
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(out)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m reshard.plot",
                                 description="Draw a `reshard_plan --json FILE` description of a plan.")
    ap.add_argument("file", help="the JSON file reshard_plan --json wrote")
    ap.add_argument("-o", "--output", default="plan.png", help="image to write (default plan.png)")
    ap.add_argument("--dpi", type=int, default=100)
    a = ap.parse_args(argv)
    try:
        render(a.file, a.output, dpi=a.dpi)
    except PlanFileError as e:
        print("reshard.plot: error: %s: %s" % (a.file, e), file=sys.stderr)
        return 1
    except OSError as e:
        print("reshard.plot: error: %s" % e, file=sys.stderr)
        return 1
    except ImportError as e:
        print("reshard.plot: error: %s (pip install \"reshard[plot]\" or matplotlib)" % e, file=sys.stderr)
        return 1
    print("reshard.plot: wrote %s" % a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())

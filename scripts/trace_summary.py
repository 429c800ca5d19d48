#!/usr/bin/env python3
"""Reads a Hearth trace (`--trace FILE.pftrace`) with Perfetto's own protobuf
definitions (PyPI's `perfetto` package), checks that it is well formed, and
prints where the time went: per track, the total and count of each span name
and the longest spans.

    .cache/pyenv/bin/python scripts/trace_summary.py run.pftrace [--top 5]
        [--expect TRACK=NAME ...] [--json]

Well formed: every packet decodes as `perfetto.protos.TracePacket`; every
event names a track described in the trace; on each track, slices begin and
end in pairs with timestamps that never go back. `--expect TRACK=NAME`
(repeatable; TRACK a track name or prefix, `requests/` for any request
track) fails unless such a span is there. Exit status 1 on any failure.
"""

import argparse
import collections
import json
import sys

try:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
except ImportError:  # pragma: no cover - set-up problem, said plainly
    sys.exit(
        "trace_summary.py needs PyPI's perfetto and protobuf packages: run "
        "`make setup` and use .cache/pyenv/bin/python"
    )

BEGIN = pb.TrackEvent.TYPE_SLICE_BEGIN
END = pb.TrackEvent.TYPE_SLICE_END
INSTANT = pb.TrackEvent.TYPE_INSTANT
COUNTER = pb.TrackEvent.TYPE_COUNTER


def annotations(event):
    out = {}
    for a in event.debug_annotations:
        kind = a.WhichOneof("value")
        out[a.name] = getattr(a, kind) if kind else None
    return out


def read(path):
    """(tracks, slices, instants, counters, errors) of the trace at path."""
    trace = pb.Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    tracks, parents = {}, {}
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            tracks[d.uuid] = d.name or (d.process.process_name if d.HasField("process") else "")
            if d.HasField("parent_uuid"):
                parents[d.uuid] = d.parent_uuid

    def path_of(uuid):
        names = []
        while uuid in tracks:
            names.append(tracks[uuid])
            uuid = parents.get(uuid)
        return "/".join(reversed(names[:-1])) if len(names) > 1 else (names[0] if names else "?")

    errors, slices, instants = [], [], []
    counters = collections.defaultdict(list)
    stacks = collections.defaultdict(list)
    last_ts = {}
    for p in trace.packet:
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        track = e.track_uuid
        if track not in tracks:
            errors.append(f"event at {p.timestamp} on undescribed track {track}")
            continue
        name = path_of(track)
        if p.timestamp < last_ts.get(track, 0):
            errors.append(f"{name}: time goes back to {p.timestamp} after {last_ts[track]}")
        last_ts[track] = p.timestamp
        if e.type == BEGIN:
            stacks[track].append((e.name, p.timestamp, annotations(e)))
        elif e.type == END:
            if not stacks[track]:
                errors.append(f"{name}: an end at {p.timestamp} with no open slice")
                continue
            span, start, args = stacks[track].pop()
            slices.append(
                {"track": name, "name": span, "start": start, "dur": p.timestamp - start,
                 "depth": len(stacks[track]), "args": args}
            )
        elif e.type == INSTANT:
            instants.append({"track": name, "name": e.name, "ts": p.timestamp, "args": annotations(e)})
        elif e.type == COUNTER:
            counters[name].append(e.double_counter_value or e.counter_value)
    for track, open_ in stacks.items():
        for span, start, _ in open_:
            errors.append(f"{path_of(track)}: slice {span!r} from {start} never ends")
    return tracks, slices, instants, dict(counters), errors


def summary(slices, instants, counters, top):
    by_track = collections.defaultdict(list)
    for s in slices:
        by_track[s["track"]].append(s)
    out = {}
    for track, spans in sorted(by_track.items()):
        totals = collections.defaultdict(lambda: [0, 0])
        for s in spans:
            totals[s["name"]][0] += s["dur"]
            totals[s["name"]][1] += 1
        out[track] = {
            "spans": len(spans),
            "by_name": sorted(
                ({"name": n, "total_ms": t / 1e6, "count": c} for n, (t, c) in totals.items()),
                key=lambda r: -r["total_ms"],
            )[:top],
            "longest": [
                {"name": s["name"], "ms": s["dur"] / 1e6, "args": s["args"]}
                for s in sorted(spans, key=lambda s: -s["dur"])[:top]
            ],
        }
    return {
        "tracks": out,
        "instants": len(instants),
        "counters": {k: {"points": len(v), "max": max(v)} for k, v in counters.items()},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--expect", action="append", default=[], metavar="TRACK=NAME")
    ap.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    args = ap.parse_args()
    tracks, slices, instants, counters, errors = read(args.trace)
    for want in args.expect:
        track, _, name = want.partition("=")
        hit = any(s["track"].startswith(track) and s["name"] == name for s in slices) or any(
            i["track"].startswith(track) and i["name"] == name for i in instants
        )
        if not hit:
            errors.append(f"no {name!r} on a track {track!r}")
    s = summary(slices, instants, counters, args.top)
    if args.json:
        print(json.dumps(s))
    else:
        for track, t in s["tracks"].items():
            print(f"{track}: {t['spans']} spans")
            for r in t["by_name"]:
                print(f"  {r['name']:<28} {r['total_ms']:>10.3f} ms in {r['count']}")
            longest = ", ".join(f"{r['name']} {r['ms']:.3f} ms" for r in t["longest"])
            print(f"  longest: {longest}")
        for name, c in s["counters"].items():
            print(f"counter {name}: {c['points']} points, max {c['max']:g}")
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()

"""``gpuscope metrics``: list, search and describe a chip's metrics, the named sets, and pass counts (offline)."""

from __future__ import annotations

import json
import sys

from gpuscope._commands.columns import _print_table
from gpuscope._commands.exits import EXIT_NOTHING_PROFILED, EXIT_OK, EXIT_USAGE


def _metrics(args) -> int:
    from gpuscope._gpu import catalog as cat
    from gpuscope._gpu import chips as _chips
    from gpuscope._gpu import metric_lists as _lists

    if args.chips:
        chips = _chips.list_chips()
        print(json.dumps(chips) if args.json else "\n".join(chips))
        return EXIT_OK
    if args.support:
        from gpuscope._gpu import support as _support

        info = _support.chip_support(args.chip or _chips.resolve_chip(None))
        print(json.dumps(info.as_dict(), indent=2) if args.json else _support.format_support(info))
        return EXIT_OK
    if args.sets and args.chip:
        return _sets_on_chip(args, _chips.resolve_chip(args.chip))
    if args.sets:
        sets = _lists.metric_sets()
        if args.json:
            print(json.dumps({n: {"kind": s.kind, "description": s.description, "metrics": list(s.metrics),
                                  "passes": s.passes} for n, s in sets.items()}, indent=2))
            return EXIT_OK
        for name, s in sets.items():
            print(f"{name} ({s.kind}, {len(s.metrics)} metrics): {s.description}")
            for m in s.metrics:
                print(f"    {m}")
        return EXIT_OK

    explicit = "sampling" if args.sampling else args.kind
    kind = explicit or "range"
    chip = _chips.resolve_chip(args.chip) if args.chip else None
    where = lambda c: f"{c}, {'PM sampling' if kind == 'sampling' else 'range profiler'}"  # noqa: E731

    if args.passes is not None:
        if not _lists.split_list(args.passes):
            raise ValueError("--passes needs metric names or metric-set names, e.g. --passes topdown,launch")
        metrics, kind = _lists.expand(args.passes, explicit)  # a set's kind needs no --sampling
        chip = chip or _chips.resolve_chip(None)
        names = _lists.resolve(metrics, chip, kind)
        passes = _lists.count_passes(names, chip, kind)
        per = {m: _lists.count_passes([m], chip, kind, plan=False) for m in names}  # each on its own
        from gpuscope.cupti import _api

        version = "%d.%d" % _api.version()
        if args.json:
            print(json.dumps({"chip": chip, "kind": kind, "cupti": version, "passes": passes,
                              "cupti_schedule_passes": _lists.count_passes(names, chip, kind, plan=False),
                              "metrics": names, "passes_per_metric": per}, indent=2))
            return EXIT_OK
        own = _lists.count_passes(names, chip, kind, plan=False)
        planned = _lists._kind(kind) is _lists.MetricKind.RANGE and _lists.consistent_plan(tuple(names), chip)
        schedule = (f"; gpuscope's pass plan, CUPTI's own schedule: {own}" if own != passes
                    else "; gpuscope's pass plan, as many as CUPTI's own schedule" if planned else "")
        from gpuscope._results.report_table import _count

        print(f"{_count(passes, 'pass')} for {_count(len(names), 'metric')} ({where(chip)}, CUPTI {version}"
              f"{schedule})")
        multi = {m: n for m, n in per.items() if n > 1}
        if multi:
            print("metrics that need several passes on their own:")
            _print_table(sorted(((n, m) for m, n in multi.items()), reverse=True), out=sys.stdout)
        if kind == "sampling" and passes > 1:
            print("PM sampling needs a single pass: drop metrics or split them over several runs.")
            return EXIT_USAGE
        return EXIT_OK

    if args.describe:
        infos = [cat.describe_metric(n, chip, kind) for n in _lists.split_list(args.describe)]
        if args.json:
            out = []
            for i in infos:
                d = dict(i.__dict__)
                if not i.suffix:
                    d["sub_metrics"] = cat.sub_metrics(i.base, chip, kind)
                out.append(d)
            print(json.dumps(out, indent=2))
            return EXIT_OK
        for i in infos:
            print(i.name)
            print(f"  type        {i.metric_type.lower()}")
            print(f"  hw unit     {i.hw_unit}")
            if i.units:
                print(f"  units       {i.units}")
            print(f"  description {i.description}")
            if not i.suffix:
                subs = cat.sub_metrics(i.base, chip, kind)
                print(f"  complete names ({len(subs)}):")
                for s in subs:
                    print(f"    {s}")
        return EXIT_OK

    if args.search:
        infos = cat.search_metrics(args.search, chip, kind, descriptions_too=not args.names_only,
                                   internal=args.internal)
        if args.json:
            print(json.dumps([i.__dict__ for i in infos], indent=2))
            return EXIT_OK if infos else EXIT_NOTHING_PROFILED
        if not infos:
            print(f"No {kind} metric matches {args.search!r}.")
            return EXIT_NOTHING_PROFILED  # as grep: a search that finds nothing is not a success
        _print_table(
            [(i.name, i.metric_type.lower(), i.hw_unit, i.description) for i in infos],
            header=("metric", "type", "hw unit", "description"),  # the unit that counts it, not a unit of measure
        )
        searched = "names" if args.names_only else "names and descriptions"
        print(f"\n{len(infos)} base metrics ({searched} searched). Complete a name with a "
              "sub-metric: gpuscope metrics --describe <name>")
        return EXIT_OK

    names = cat.list_metrics(chip, kind, args.type, full=args.full, internal=args.internal)
    print(json.dumps(names) if args.json else "\n".join(names))
    return EXIT_OK


def _sets_on_chip(args, chip: str) -> int:
    """``gpuscope metrics --sets --chip X``: every set as the chip collects it, with what was substituted."""
    from gpuscope._gpu import metric_lists as _lists
    from gpuscope._gpu import support as _support

    info = _support.chip_support(chip)
    if args.json:
        print(json.dumps({s["name"]: s for s in info.as_dict()["sets"]}, indent=2))
        return EXIT_OK
    for st in info.sets:
        if st.error:
            print(f"{st.name} ({st.kind}) on {info.chip}: unsupported: {st.error}")
            continue
        print(f"{st.name} ({st.kind}, {len(st.metrics)} metrics, {st.passes} pass{'es' if st.passes != 1 else ''} "
              f"on {info.chip}, {st.status}): {_lists.metric_set(st.name).description}")
        for m in st.metrics:
            print(f"    {m}")
        for original in st.substituted:
            print(f"  substituted: {st.substitution(original)}")
        for original in st.left_out:
            print(f"  left out: {original} (no equivalent on {info.chip})")
    print(f"\n{info.chip} ({info.family}): " + ("verified on hardware" if info.hardware else
                                                "checked offline only (CUPTI host API), not run on this GPU"))
    return EXIT_OK

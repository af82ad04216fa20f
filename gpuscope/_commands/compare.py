"""``gpuscope compare``: per-kernel differences between two saved runs, flagged where larger than run-to-run noise."""

from __future__ import annotations

import sys

from gpuscope._commands.exits import EXIT_CHANGED, EXIT_OK
from gpuscope._commands.show import _open, csv_output, write_csv
from gpuscope._util.terminal import printable


def _compare(args) -> int:
    import warnings

    from gpuscope._results.compare import compare
    from gpuscope.errors import GpuscopeWarning

    csv_path = csv_output(args)
    base, new = _open(args.base), _open(args.new)
    mismatch = _device_mismatch(base, new)
    if mismatch:
        print(printable(f"gpuscope compare: warning: {mismatch}"), file=sys.stderr)
    with warnings.catch_warnings():  # the coverage warnings of Top-Down repeat for each file; compare says enough
        warnings.simplefilter("ignore", GpuscopeWarning)
        result = compare(base, new, alpha=args.alpha, min_change=args.min_change)
    if args.all:
        print(printable(result.to_text(all_rows=True)))
    else:
        print(printable(result))
    if csv_path:
        write_csv(csv_path, result.to_csv, args)
    if getattr(args, "html", None):
        from gpuscope._results.html_pages import compare_html

        compare_html(result, args.html, overwrite=getattr(args, "force", False))
        print(printable(f"gpuscope compare: wrote {args.html}"), file=sys.stderr)
    if args.fail_on:
        flagged = result.flagged(args.fail_on)
        if flagged:
            rows = ", ".join(f"{k} {q}" for k, q in flagged[:5]) + (" ..." if len(flagged) > 5 else "")
            print(printable(f"gpuscope compare: --fail-on {args.fail_on}: {len(flagged)} difference(s) beyond noise "
                            f"({rows}); status {EXIT_CHANGED}"), file=sys.stderr)
            return EXIT_CHANGED
    return EXIT_OK


def _device_mismatch(base, new) -> str:
    """What differs between the devices the two files were recorded on (name, chip, clocks aside), or ""."""
    fields = ("device_name", "chip", "compute_capability", "sm_count")
    differ = [f for f in fields if str(base.attrs.get(f, "")) != str(new.attrs.get(f, ""))
              and base.attrs.get(f) is not None and new.attrs.get(f) is not None]
    if not differ:
        return ""
    said = "; ".join(f"{f} {base.attrs[f]} vs {new.attrs[f]}" for f in differ)
    return (f"the two files come from different devices ({said}): a difference may be the hardware's, not the "
            "code's. Compare runs on the same kind of GPU to judge a change of code.")

"""``gpuscope show``: the report of each saved file, its details page (``--page details``), or every value in it
(``--page raw``).

A saved file is opened and checked here (:func:`_open`) for ``gpuscope compare`` too.
"""

from __future__ import annotations

from gpuscope._commands.exits import EXIT_OK
from gpuscope._util.terminal import printable
from gpuscope.errors import NotGpuscopeDataError

#: What a file of each kind cannot lack: a dim (range results, PM samples) or a variable (PC samples).
_KIND_NEEDS = {"range": "range", "pm_sampling": "time", "pc_sampling": "kernel_samples"}


def _open(path: str):
    """A saved gpuscope Dataset, or an error that says what the file is not."""
    from gpuscope._results.io import open_dataset
    from gpuscope._results.report_inputs import _kind

    try:
        ds = open_dataset(path)
    except (FileNotFoundError, IsADirectoryError, NotGpuscopeDataError, ChildProcessError):  # their messages say it
        # all (ChildProcessError: the file's check could not run, which says nothing of the file)
        raise
    except (OSError, ValueError) as exc:
        raise NotGpuscopeDataError(
            f"{path} is not a netCDF file that gpuscope can read ({str(exc).rstrip('.')}). gpuscope writes its "
            "results with gpuscope run -o FILE.nc or gpuscope.save_dataset.") from None
    try:
        _kind(ds)
    except NotGpuscopeDataError as exc:
        raise NotGpuscopeDataError(f"{path}: {exc}") from None
    if "device" not in ds.dims:  # a file of several devices: each device's part is checked (by _show)
        _check_dims(path, ds)
    return ds


def _check_dims(path: str, ds) -> None:
    """Raise unless *ds* has what its kind cannot lack (an edited ``kind`` made the report fail on a missing dim)."""
    from gpuscope._results.report_inputs import _kind

    kind = _kind(ds)
    need = _KIND_NEEDS[kind]
    if need not in ds.dims and need not in ds.data_vars:
        raise NotGpuscopeDataError(
            f"{path}: its kind attribute says {kind!r}, but it has no {need!r} "
            f"{'variable' if kind == 'pc_sampling' else 'dim'} (its dims: {', '.join(map(str, ds.dims)) or 'none'}): "
            "the file was edited or damaged. Save the Dataset again with gpuscope.save_dataset.")


def _no_samples(path: str, ds) -> str:
    """What show says of PM samples without a sample (a run whose samples were all lost writes one)."""
    from gpuscope._results.report_inputs import _device_line

    lost = ds.attrs.get("lost_samples")
    why = f"{lost} samples were lost during collection (attrs['lost_samples'])" if lost else "none was recorded"
    return f"gpuscope report: PM sampling, no samples ({_device_line(ds)})\n(no rows)\nnote: {path} holds no " \
           f"samples: {why}."


def _show(args) -> int:
    import pandas as pd

    from gpuscope._pm_sampling.multi import each_device
    from gpuscope._results.report import raw_text, report
    from gpuscope._schema.dataset import to_dataframe

    if args.page == "raw" and args.by:
        raise ValueError("--by groups the rows of the summary and details pages; --page raw lists every row as it "
                         "was recorded")
    options = {"by": args.by} if args.by else {}
    csv_path = csv_output(args)
    html = getattr(args, "html", None)
    if html:
        _check_html(args)
    tables = {}
    for number, path in enumerate(args.files):
        parts = each_device(_open(path))  # a file of several devices: each device's report
        if html and len(parts) > 1:
            raise ValueError(f"{path} holds the samples of {len(parts)} devices; --html writes one page: "
                             "gpuscope.report(gpuscope.select_device(ds, N), html='PAGE.html') for each device")
        if len(args.files) > 1:  # several files: each report under its file's name
            print(printable(f"{'' if number == 0 else chr(10)}== {path} =="))
        for part in parts:
            _check_dims(path, part)
            if len(parts) > 1:
                print(f"device {part.attrs['device_index']}:")
            if part.attrs.get("kind") == "pm_sampling" and part.sizes.get("time") == 0:
                print(printable(_no_samples(path, part)))
            elif args.page == "raw":
                print(printable(raw_text(part)))
                tables[(path, part.attrs.get("device_index", 0))] = to_dataframe(part)
            else:
                if html:
                    _write_html(part, html, options, getattr(args, "force", False))
                table = report(part, page=args.page, **options)
                print(printable(table))
                tables[(path, part.attrs.get("device_index", 0))] = table.with_units().reset_index()
    if csv_path and tables:  # one table: with several files or devices, each row says which
        frame = next(iter(tables.values())) if len(tables) == 1 else (
            pd.concat(tables, names=["file", "device"]).reset_index(level=[0, 1]))
        write_csv(csv_path, lambda tmp: frame.to_csv(tmp, index=False), args)
    return EXIT_OK


def csv_output(args) -> str | None:
    """The absolute path of ``--csv``, checked before anything is read (no link, a regular file, one that exists
    only with ``-f``: :func:`gpuscope._util.outputs.check`); None without ``--csv``."""
    from gpuscope._util import outputs

    return outputs.check(args.csv, overwrite=getattr(args, "force", False), hint=_CSV_HINT) if args.csv else None


def write_csv(path: str, fill, args) -> None:
    """Write the ``--csv`` file with ``fill(tmp)`` (:func:`gpuscope._util.outputs.write`: complete or not at all)."""
    from gpuscope._util import outputs

    outputs.write(path, fill, overwrite=getattr(args, "force", False), hint=_CSV_HINT)


_CSV_HINT = "pass -f/--force to replace it, or give --csv another name"


def _check_html(args) -> None:
    """Refuse --html where it cannot make one page, before anything is read."""
    if len(args.files) > 1:
        raise ValueError(f"--html writes the page of one file; {len(args.files)} were given: run gpuscope show "
                         "FILE --html PAGE.html once per file (gpuscope compare BASE NEW --html PAGE.html sets two "
                         "runs side by side)")
    if args.page == "raw":
        raise ValueError("--html writes the report's page (tables and figures of the summary and details); --page "
                         "raw is text: leave out one of the two")
    from gpuscope._results.html import libraries

    libraries()


def _write_html(ds, path: str, options: dict, force: bool) -> None:
    """The HTML page of *ds* at *path* (said on stderr, the report's tables going to stdout); an existing file is
    replaced only with -f."""
    import sys

    from gpuscope._results.html_pages import report_html
    from gpuscope._results.report import report

    report_html(ds, path, report=report, overwrite=force, **options)
    print(printable(f"gpuscope show: wrote {path}"), file=sys.stderr)

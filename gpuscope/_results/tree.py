"""PM samples as an xarray DataTree: the samples at the root, the span and execution tables as child nodes of
variables along their own dims (as a saved file's groups hold them), and back."""

from __future__ import annotations

from gpuscope._results import io as _io
from gpuscope._schema import dataset as _dataset


def _pm_arg(ds, what: str) -> None:
    """ValueError unless *ds* is PM samples (or a Dataset computed from them, such as phases)."""
    kind = ds.attrs.get("kind")
    if kind != "pm_sampling":
        raise ValueError(
            f"{what} PM samples (a Dataset of gpuscope.sample, or gpuscope.open_dataset of a saved series: attrs "
            f"kind='pm_sampling'), whose span and execution tables are the tree's child nodes; this one has "
            f"kind={kind!r}. Range results and PC samples hold no tables: use them as Datasets.")


def datatree(ds):
    """PM samples as an ``xarray.DataTree``: the samples at the root, each table as variables along its own dim.

    In a Dataset of PM samples every variable lies along ``time``, so that ``ds.to_dataframe()`` has one row per
    sample, and the span and execution tables, whose rows are not samples, are Dataset attrs (one 1-D array per
    column). The tree holds them as a saved file's groups do (:func:`gpuscope.save_dataset`): the root is the
    Dataset without the table attrs, the child ``spans`` holds ``span_path``, ``span_thread``, ``span_start_ns``
    and ``span_end_ns`` along the dim ``span``, and the child ``executions`` (``gpuscope.sample(kernels=True)``)
    the columns of :func:`gpuscope.kernel_executions` along ``execution`` (``exec_kernel``, ...,
    ``exec_graph_id``, ``exec_graph_node_id``), each with attrs ``units``/``description``; Datasets merged
    across ranks or devices add ``span_rank``, ``exec_device``. A Dataset without a table has no such child (a
    recording without ``gpuscope.range`` has an empty span table: a ``spans`` child of 0 rows). No values are
    copied. :func:`gpuscope.from_datatree` gives the Dataset back, identical.

    A child node inherits the root's ``time`` index, as in any DataTree: take a table alone with
    ``tree["spans"].to_dataset(inherit=False)`` (its ``to_dataframe()`` has one row per span).

    Parameters
    ----------
    ds : xarray.Dataset
        PM samples (:func:`gpuscope.sample`, :func:`gpuscope.open_dataset`), or a Dataset computed from them that
        keeps the tables (:func:`gpuscope.phases`, :func:`gpuscope.merge_ranks`, :func:`gpuscope.combine_devices`).
        Older layouts in memory are converted as :func:`gpuscope.open_dataset` converts files.

    Returns
    -------
    xarray.DataTree

    Raises
    ------
    ValueError
        *ds* is not a Dataset (a path: open it with :func:`gpuscope.open_dataset` first), or not PM samples (range
        results, PC samples: they hold no tables).

    Examples
    --------
    >>> tree = gpuscope.datatree(gpuscope.open_dataset("series.nc"))           # doctest: +SKIP
    >>> tree["spans"].to_dataset(inherit=False).to_dataframe()                  # doctest: +SKIP
    """
    import xarray as xr

    _io._dataset_arg(ds, "datatree takes")
    _pm_arg(ds, "datatree takes")
    samples, tables = _dataset.table_groups(_dataset.upgrade(ds))
    return xr.DataTree.from_dict({"/": samples, **{f"/{name}": table for name, table in tables.items()}})


def from_datatree(tree):
    """The PM samples Dataset of a tree that :func:`gpuscope.datatree` gave: the root's samples with the child
    nodes' tables as Dataset attrs again (``xr.testing.assert_identical`` holds with the Dataset the tree came
    from).

    Parameters
    ----------
    tree : xarray.DataTree
        PM samples at the root, child nodes ``spans`` and ``executions`` (each optional) as
        :func:`gpuscope.datatree` makes them.

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    ValueError
        *tree* is not a DataTree; its root is not PM samples; it has nodes other than ``spans`` and
        ``executions``, or a table node lacks a column (they would be lost); or it was read from a file as stored
        (``xr.open_datatree``: strings as integer codes, attrs encoded), which :func:`gpuscope.open_dataset` reads.
    """
    import xarray as xr

    if not isinstance(tree, xr.DataTree):
        hint = " (it is already the Dataset)" if isinstance(tree, xr.Dataset) else ""
        raise ValueError(f"from_datatree takes an xarray.DataTree (from gpuscope.datatree); got "
                         f"{type(tree).__name__}{hint}")
    if _io.ATTR_TYPES in tree.attrs or any(_io.STRING_TABLE in variable.attrs for node in tree.subtree
                                           for variable in node.variables.values()):
        raise ValueError("This tree was read from a gpuscope file as stored (xr.open_datatree: strings as integer "
                         "codes, attrs encoded): read the file with gpuscope.open_dataset(path), and take "
                         "gpuscope.datatree of that for the tree.")
    samples = tree.to_dataset(inherit=False)
    _pm_arg(samples, "from_datatree reads a tree whose root is")
    others = [path for path in (node.relative_to(tree) for node in tree.descendants)
              if path not in _dataset.TABLE_GROUPS]
    if others:
        raise ValueError(f"from_datatree gives back the Dataset of gpuscope.datatree's nodes (spans, executions); "
                         f"this tree also has {others}, which the Dataset cannot hold: take them out first")
    tables = {name: node.to_dataset(inherit=False) for name, node in tree.children.items()}
    try:
        return _dataset.upgrade(_dataset.join_tables(samples, tables))
    except KeyError as exc:
        raise ValueError(f"a table node of the tree lacks the column {exc.args[0]!r}: the nodes hold every column "
                         "that gpuscope.datatree gives them") from None

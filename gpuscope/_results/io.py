"""netCDF save and load of gpuscope Datasets: a lossless round trip, older schemas converted on load."""

from __future__ import annotations

import json
import os

import numpy as np

from gpuscope._results import untrusted as _untrusted
from gpuscope._schema import dataset as _dataset
from gpuscope._util import outputs as _outputs
from gpuscope._util import validate as _validate
from gpuscope.errors import NotGpuscopeDataError


def _dataset_arg(ds, what: str) -> None:
    import xarray as xr

    if not isinstance(ds, xr.Dataset):
        hint = " (load a file first with gpuscope.open_dataset)" if isinstance(ds, (str, os.PathLike)) else ""
        raise ValueError(f"{what} an xarray.Dataset as ds{hint}; got {type(ds).__name__}")


def _path_arg(path, what: str) -> None:
    if path is None:
        raise ValueError(f"{what} (path=, a str or pathlib.Path); got None")
    _validate.path(path, "path")


# ---------------------------------------------------------------------------------------------------------
# netCDF (HDF5 through h5netcdf): lossless round trip of every gpuscope Dataset
# ---------------------------------------------------------------------------------------------------------


#: Dataset attr in which :func:`save_dataset` records the attrs netCDF cannot store as they are.
ATTR_TYPES = "gpuscope_attr_types"


def _encode_attr(value):
    """(netCDF-safe value, type tag or None when stored as it is)."""
    if value is None:
        return "", "none"
    if isinstance(value, (bool, np.bool_)):
        return int(value), "bool"
    if isinstance(value, dict):
        return json.dumps(value), "json"
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value.tolist() if isinstance(value, np.ndarray) else value)
        if not items:
            return "", "list"
        if all(isinstance(v, (bool, np.bool_)) for v in items):
            return np.asarray(items, dtype=np.int8), "bool_list"
        if all(isinstance(v, str) for v in items):
            return items, "list"
        if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)) for v in items):
            return np.asarray(items), "list"
        raise ValueError(f"a list attr must hold only str, only numbers or only bools, got {items[:5]!r}; "
                         "convert it (e.g. to a JSON string) before saving")
    if isinstance(value, (str, int, float, np.integer, np.floating)):
        return value, None
    raise ValueError(f"netCDF cannot store an attr of type {type(value).__name__} ({value!r}); use str, numbers, "
                     "bool, None, lists of those, or a dict (saved as JSON)")


#: Variable attr of a string variable that :func:`save_dataset` stored as integer codes: the JSON list of its
#: distinct strings, which the codes index.
STRING_TABLE = "gpuscope_strings"


def _encode_strings(ds):
    """*ds* with each object-dtype string variable that is not an index (the per-sample ``range`` of PM samples) as
    int32 codes into a table of its distinct strings: netCDF would store every sample's string in full, and xarray
    read them back as a ``<U`` array of 4 bytes per character of the longest (GBs for long range names)."""
    import pandas as pd

    for name, var in list(ds.variables.items()):
        if var.dtype != object or name in ds.indexes:
            continue
        try:
            codes, names = pd.factorize(var.values.ravel())
        except TypeError:  # unhashable values: not strings, left for netCDF to refuse or store
            continue
        if (codes < 0).any() or not all(isinstance(v, str) for v in names):
            continue  # not only strings: left as it is
        coded = var.copy(data=codes.astype(np.int32).reshape(var.shape))
        coded.attrs[STRING_TABLE] = json.dumps(list(names))
        coded.encoding = {}  # a string encoding read from a file does not fit the codes
        ds = ds.assign_coords({name: coded}) if name in ds.coords else ds.assign({name: coded})
    return ds


def _decode_strings(ds, path):
    """Undo :func:`_encode_strings`: each coded variable as an object array holding one str per distinct value.
    Codes and tables that :func:`_encode_strings` does not write raise :class:`NotGpuscopeDataError`: a negative
    code would index from the end of the table and relabel samples without a word."""
    for name, var in list(ds.variables.items()):
        if STRING_TABLE not in var.attrs:
            continue
        text = var.attrs[STRING_TABLE]
        try:
            table = json.loads(text) if isinstance(text, str) else None
        except ValueError:
            table = None
        codes = var.values
        if not (isinstance(table, list) and all(isinstance(v, str) for v in table)):
            raise _damaged(path, f"the {STRING_TABLE} attribute of {name!r} ({str(text)[:80]!r}) is not a JSON list "
                                 "of strings")
        if codes.dtype.kind not in "iu":
            raise _damaged(path, f"{name!r} holds {codes.dtype} values, not integer codes into its {STRING_TABLE}")
        outside = codes[(codes < 0) | (codes >= len(table))]
        if outside.size:
            raise _damaged(path, f"{name!r} holds the code {outside.flat[0]}, and its {STRING_TABLE} has "
                                 f"{len(table)} strings (codes 0 to {len(table) - 1})")
        var = var.copy(data=np.array(table, dtype=object)[codes])
        del var.attrs[STRING_TABLE]
        ds = ds.assign_coords({name: var}) if name in ds.coords else ds.assign({name: var})
    return ds


def _damaged(path, what: str):
    """The error for a file whose content is not what :func:`save_dataset` writes."""
    return NotGpuscopeDataError(f"{os.fspath(path)}: {what}: the file was edited or damaged. Save the Dataset again "
                                "with gpuscope.save_dataset.")


#: The type tags :func:`_encode_attr` writes.
_TAGS = ("none", "bool", "json", "list", "bool_list")


def _attr_types(ds, path) -> dict:
    """The ``{owner: {attr: tag}}`` table of a file, taken out of its attrs; a clear error if it is not one."""
    text = ds.attrs.pop(ATTR_TYPES, "{}")
    try:
        tags = json.loads(text)
    except (TypeError, ValueError):
        tags = None
    if not (isinstance(tags, dict) and all(
            isinstance(attrs, dict) and all(isinstance(tag, str) and tag in _TAGS for tag in attrs.values())
            for attrs in tags.values())):
        raise NotGpuscopeDataError(
            f"{os.fspath(path)}: its {ATTR_TYPES} attribute ({str(text)[:80]!r}) is not what gpuscope writes (a JSON "
            f"object {{variable or \"\": {{attr: type}}}} with types {', '.join(_TAGS)}): the file was edited or "
            f"damaged. Save the Dataset again with gpuscope.save_dataset, or delete that attribute to read it as "
            "plain netCDF.")
    return tags


def _shown(value) -> str:
    """*value* as an error message shows it (numpy scalars and arrays as plain Python)."""
    return repr(value.tolist() if isinstance(value, (np.ndarray, np.generic)) else value)


def _decode_attr(value, tag: str):
    """*value* as :func:`_encode_attr` encoded it with *tag*; ValueError if it cannot be (the file was edited)."""
    if tag == "none":
        if not (isinstance(value, str) and value == ""):
            raise ValueError(f"it holds {_shown(value)}, where None is stored as ''")
        return None
    if tag == "json":
        if not isinstance(value, str):
            raise ValueError(f"it holds {_shown(value)}, not JSON text")
        return json.loads(value)
    items = [value] if tag == "bool" else _dataset._as_list(value)
    if tag in ("bool", "bool_list"):
        if not all(isinstance(v, (int, np.integer)) and v in (0, 1) for v in items):
            raise ValueError(f"it holds {_shown(value)}, where bools are stored as 0 and 1")
        return bool(value) if tag == "bool" else [bool(v) for v in items]
    return items


def save_dataset(ds, path: str | os.PathLike, *, overwrite: bool = True) -> None:
    """Write a gpuscope Dataset to a netCDF-4 file (HDF5, through h5netcdf), losslessly.

    :func:`open_dataset` reads it back identical, indexes and attrs included. Attrs that netCDF cannot store
    as they are (bool, None, lists, which come back as a scalar when they have one element, dicts) are encoded,
    and the Dataset attr ``gpuscope_attr_types`` (a JSON dict ``{variable or "": {attr: type}}``) records how
    to decode them; other readers see ``0``/``1`` for bools, ``""`` for None and ``[]``, and JSON text for
    dicts. The span and execution tables of PM samples (Dataset attrs in memory) are stored as the netCDF groups
    ``spans`` and ``executions``, one variable per column along ``span`` / ``execution``
    (:data:`gpuscope._schema.dataset.TABLE_GROUPS`): ``xr.open_datatree(path)`` shows the samples and the tables
    (the nodes of :func:`gpuscope.datatree`), ``xr.open_dataset(path)`` the samples. String variables of dtype
    object (the per-sample ``range`` of PM samples, ``span_path`` and ``exec_kernel`` of their tables) are stored
    as integer codes with their distinct strings in the attr ``gpuscope_strings`` (JSON), so a long range name is
    stored once.

    Parameters
    ----------
    ds : xarray.Dataset
        Any Dataset; gpuscope's own are the usual case.
    path : str or PathLike
        File to write. The file is made in memory first (so a full disk fails the save with an ``OSError``, never
        inside HDF5), written to a temporary file in the same folder, flushed to disk, then renamed to *path*: a
        save that fails (or is interrupted, or the power goes) leaves the file that was there as it was, and no
        temporary file. The new file keeps the replaced one's mode (and owner and group, as far as this process
        may give them). A file with other hard links is replaced under *path* only: the other names keep the old
        contents, and a :class:`~gpuscope.errors.GpuscopeWarning` says so. A symbolic link, a folder, a device,
        a FIFO or a socket at *path* is never written through or replaced (docs/reliability.md, "Output files").
    overwrite : bool, default True
        False: refuse a file that exists, when the save starts and when it ends (another process may have saved
        there meanwhile: one of several saves to one new name wins, the others raise).

    Raises
    ------
    ValueError
        *ds* is not a Dataset (None included), *path* is None, or an attribute holds a value that cannot be stored
        (an object, a list of mixed types); the message names it.
    TypeError
        *path* is not a str or PathLike.
    OSError
        The file cannot be written: a full disk (nothing is left at *path* but what was there), a missing or
        read-only folder, a symbolic link or something that is not a regular file at *path*, a file that exists
        with ``overwrite=False`` (:class:`FileExistsError`); the message says which.
    """
    _dataset_arg(ds, "save_dataset writes")
    _path_arg(path, "save_dataset needs a path to write to")
    out, groups = _dataset.table_groups(ds)
    out = _encode_strings(out)
    groups = {name: _encode_strings(group) for name, group in groups.items()}
    tags = {}
    for owner, attrs in [("", out.attrs)] + [(str(k), out[k].attrs) for k in out.variables]:
        encoded = {}
        for key, value in attrs.items():
            if key == ATTR_TYPES and owner == "":
                continue
            try:
                encoded[key], tag = _encode_attr(value)
            except ValueError as err:
                raise ValueError(f"attr {key!r} of {owner or 'the Dataset'}: {err}") from None
            if tag:
                tags.setdefault(owner, {})[key] = tag
        if owner == "":
            out.attrs = encoded
        else:
            out[owner].attrs = encoded
    if tags:
        out.attrs[ATTR_TYPES] = json.dumps(tags, sort_keys=True)
    _outputs.write_bytes(path, _netcdf_bytes(out, groups), overwrite=overwrite)


def _netcdf_bytes(out, groups):
    """The netCDF file of *out* and its table *groups*, made in memory: HDF5 never writes to a disk, so a full disk
    cannot fail one of its writes (which crashed the process with SIGSEGV when it did, even with the error caught)."""
    import io

    buffer = io.BytesIO()
    out.to_netcdf(buffer, engine="h5netcdf")
    for name, group in groups.items():
        group.to_netcdf(buffer, mode="a", group=name, engine="h5netcdf")
    return buffer.getbuffer()


def _table_groups(data: bytes, path) -> dict:
    """The groups of the file *data* (read from *path*) that hold tables
    (:data:`gpuscope._schema.dataset.TABLE_GROUPS`), read and decoded: group name -> Dataset."""
    import io

    import h5netcdf

    with h5netcdf.File(io.BytesIO(data), "r") as f:
        names = [name for name in f.groups if name in _dataset.TABLE_GROUPS]
    return {name: _decode_strings(_parsed(data, path, group=name), path) for name in names}


def _parsed(data: bytes, path, **options):
    """The Dataset (or a group of it) in the file *data*, loaded; xarray's and HDF5's errors on a file that the
    child read whole (netCDF structure that does not fit: a dimension scale missing, an attribute of the wrong
    type) as :class:`NotGpuscopeDataError`."""
    import io

    import xarray as xr

    try:
        with xr.open_dataset(io.BytesIO(data), engine="h5netcdf", **options) as ds:
            return ds.load()
    except (OSError, RuntimeError, KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
        raise _damaged(path, f"netCDF cannot read it ({type(exc).__name__}: {str(exc)[:200]})") from None


def open_dataset(path: str | os.PathLike):
    """Load a Dataset saved with :func:`save_dataset` (or ``ds.to_netcdf``), fully into memory.

    Attrs come back with the types they were saved with (see :func:`save_dataset`), and the tables of PM samples
    from the file's groups; the index of range results (the row number) is restored; files of an older gpuscope
    layout are converted to the current one, exactly (schema 1, gpuscope 0.1: grid and block along an ``xyz``
    dim, user ranges as data variables along ``span``; schema 2: the span and execution tables of PM samples in
    list attrs, each sample's span as the coordinate ``span``, now ``span_index``; schemas 3 and 4: the tables as
    coordinates along ``span`` and ``execution``; schemas 1 to 3: range results indexed by path), and metric
    units an older gpuscope wrote (``byte/second/second``) are corrected
    (:func:`gpuscope._schema.dataset.upgrade`). So ``xr.testing.assert_identical`` holds between a saved and the
    loaded Dataset.

    Parameters
    ----------
    path : str or PathLike
        A netCDF-4 file.

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    FileNotFoundError
        No file at *path*.
    OSError
        The file cannot be read (permissions); :class:`ChildProcessError` when no Python interpreter can be
        started for the check, or one never gets ready (set ``GPUSCOPE_PYTHON``).
    gpuscope.errors.NotGpuscopeDataError
        Not a regular file (a FIFO or a device is refused, never waited on), not a netCDF-4 (HDF5) file, or one that
        HDF5 cannot read safely: the file is read whole by HDF5 in a child process first, with a deadline and a
        memory limit (:mod:`gpuscope._results.untrusted`), so a damaged file that makes HDF5 fail, spin, crash or
        allocate a size it declares beyond what the file holds is refused instead of hanging or flooding this
        process. Or the file's ``gpuscope_attr_types`` record is malformed (not the JSON table
        :func:`save_dataset` writes), an attr cannot be decoded as it says (a ``json`` tag on a number, a ``bool``
        tag on text), a string variable's codes or ``gpuscope_strings`` table are not what :func:`save_dataset`
        writes (a code below 0 or past the table, a table that is not a JSON list of strings), or the tables of an
        older schema do not fit together. The message names the file and what is wrong.
    ValueError
        *path* is None.
    TypeError
        *path* is not a str or PathLike (an integer would be read as an open file descriptor).
    """
    _path_arg(path, "open_dataset needs a path")
    if not os.path.exists(path):
        raise FileNotFoundError(f"No such file: {os.fspath(path)!r} (no gpuscope dataset there).")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{os.fspath(path)!r} is a folder, not a gpuscope dataset: give a .nc file in it.")
    data = _untrusted.read(path)  # the bytes, once HDF5 read them whole in a child: no hang, flood or crash here
    ds = _parsed(data, path)
    groups = _table_groups(data, path)
    tags = _attr_types(ds, path)
    for owner, attrs in [("", ds.attrs)] + [(str(k), ds[k].attrs) for k in ds.variables]:
        for key, value in list(attrs.items()):
            tag = tags.get(owner, {}).get(key)
            if tag:
                try:
                    attrs[key] = _decode_attr(value, tag)
                except ValueError as exc:
                    raise _damaged(path, f"attr {key!r} of {owner or 'the Dataset'} cannot be read as {tag} "
                                         f"({exc})") from None
            elif isinstance(value, np.ndarray):
                attrs[key] = value.tolist()
    if "metrics" in ds.attrs:  # files from before gpuscope_attr_types: one metric came back as a str
        ds.attrs["metrics"] = _dataset._as_list(ds.attrs["metrics"])
    ds = _decode_strings(ds, path)
    try:
        return _dataset.upgrade(_dataset.join_tables(ds, groups))
    except (ValueError, TypeError, IndexError, KeyError) as exc:  # tables of an older schema that do not fit
        raise _damaged(path, f"it cannot be converted from gpuscope schema {ds.attrs.get('gpuscope_schema', 1)} "
                             f"({type(exc).__name__}: {exc})") from None

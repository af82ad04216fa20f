"""The ctypes shim over CUPTI: one module per C header, 1:1 with the C API, no policy, no xarray.

It imports nothing from gpuscope but :mod:`gpuscope.errors`."""

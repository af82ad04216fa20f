"""CUPTI's NVTX callbacks (``CUPTI_CB_DOMAIN_NVTX``): the NVTX range pushes and pops, domains and registered
strings of this process, as they are called.

NVTX calls reach CUPTI only where ``NVTX_INJECTION64_PATH`` named libcupti before the calling library's first NVTX
call (NVTX 3 reads it once per library that embeds NVTX; CUPTI user guide, "NVIDIA Tools Extension Callbacks").
:class:`NvtxWatcher` enables the callbacks of the calls below on gpuscope's one CUPTI subscriber
(:mod:`gpuscope.cupti.callbacks`) while it is open, and hands each call, parsed, to ``on_call(NvtxCall)`` on the
calling thread. Marks and start/end ranges are not heard.

Layouts, with the header each comes from (checked against the CUPTI 13.1 wheel's ``include/``):

* ``CUpti_NvtxData`` (cupti_callbacks.h): ``functionName``, ``functionParams``, ``functionReturnValue``;
  it has no callback site: CUPTI calls back once per NVTX call, with the return value set.
* ``CUpti_nvtx_api_trace_cbid`` (cupti_nvtx_cbid.h): the ``CBID_*`` values here.
* the ``*_params`` structs (generated_nvtx_meta.h): one member per argument of the NVTX function;
  ``nvtxDomainRangePushEx_params`` is ``{domain, core: nvtxRangePushEx_params}``. The header has no
  ``nvtxDomainCreateW_params``; the call has one argument, a ``const wchar_t*``, read as such. Its
  ``nvtxDomainRegisterStringW_params.string`` is declared ``const char*``, but ``nvtxDomainRegisterStringW``
  takes (and passes on) a ``const wchar_t*``, so it is read as wide characters.
* ``nvtxEventAttributes_v2`` (nvtx3/nvToolsExt.h): message type at offset 32, message (a union of
  ``const char*``, ``const wchar_t*`` and ``nvtxStringHandle_t``) at 40; ``NVTX_MESSAGE_TYPE_*`` values.
"""

from __future__ import annotations

import ctypes
import dataclasses
import warnings
from ctypes import Structure, c_char_p, c_int32, c_uint16, c_uint32, c_uint64, c_void_p

from gpuscope.cupti import callbacks
from gpuscope.errors import GpuscopeWarning

__all__ = ["CBIDS", "INJECTION_VAR", "NvtxCall", "NvtxWatcher", "parse"]

#: What NVTX 3 reads at a library's first NVTX call to find the tool to load (nvtx3/nvtxDetail/nvtxInit.h).
INJECTION_VAR = "NVTX_INJECTION64_PATH"

# CUpti_nvtx_api_trace_cbid (cupti_nvtx_cbid.h; values never change)
CBID_nvtxRangePushA = 8
CBID_nvtxRangePushW = 9
CBID_nvtxRangePushEx = 10
CBID_nvtxRangePop = 11
CBID_nvtxDomainRangePushEx = 33
CBID_nvtxDomainRangePop = 34
CBID_nvtxDomainRegisterStringA = 39
CBID_nvtxDomainRegisterStringW = 40
CBID_nvtxDomainCreateA = 41
CBID_nvtxDomainCreateW = 42
CBID_nvtxDomainDestroy = 43
CBIDS = (CBID_nvtxRangePushA, CBID_nvtxRangePushW, CBID_nvtxRangePushEx, CBID_nvtxRangePop,
         CBID_nvtxDomainRangePushEx, CBID_nvtxDomainRangePop, CBID_nvtxDomainRegisterStringA,
         CBID_nvtxDomainRegisterStringW, CBID_nvtxDomainCreateA, CBID_nvtxDomainCreateW, CBID_nvtxDomainDestroy)

# nvtxMessageType_t (nvtx3/nvToolsExt.h)
NVTX_MESSAGE_UNKNOWN = 0
NVTX_MESSAGE_TYPE_ASCII = 1
NVTX_MESSAGE_TYPE_UNICODE = 2
NVTX_MESSAGE_TYPE_REGISTERED = 3


class CUpti_NvtxData(Structure):  # cupti_callbacks.h
    _fields_ = [("functionName", c_char_p), ("functionParams", c_void_p), ("functionReturnValue", c_void_p)]


class nvtxEventAttributes_v2(Structure):  # nvtx3/nvToolsExt.h
    _fields_ = [
        ("version", c_uint16),
        ("size", c_uint16),
        ("category", c_uint32),
        ("colorType", c_int32),  # nvtxColorType_t
        ("color", c_uint32),
        ("payloadType", c_int32),  # nvtxPayloadType_t
        ("reserved0", c_int32),
        ("payload", c_uint64),  # union payload_t: 8 bytes (uint64_t, int64_t, double, ...)
        ("messageType", c_int32),  # nvtxMessageType_t
        ("message", c_void_p),  # union nvtxMessageValue_t: const char*, const wchar_t*, nvtxStringHandle_t
    ]


assert nvtxEventAttributes_v2.messageType.offset == 32 and nvtxEventAttributes_v2.message.offset == 40
assert ctypes.sizeof(nvtxEventAttributes_v2) == 48  # NVTX_EVENT_ATTRIB_STRUCT_SIZE on LP64


class _OneArg(Structure):  # nvtxRangePushA/W_params {message}, nvtxRangePushEx_params {eventAttrib},
    _fields_ = [("arg", c_void_p)]  # nvtxDomainCreateA_params {name}, nvtxDomain(RangePop|Destroy)_params {domain}


class _DomainAndArg(Structure):  # nvtxDomainRangePushEx_params {domain, core.eventAttrib},
    _fields_ = [("domain", c_void_p), ("arg", c_void_p)]  # nvtxDomainRegisterStringA/W_params {domain, string}


@dataclasses.dataclass(frozen=True)
class NvtxCall:
    """One NVTX call, parsed.

    ``kind`` is ``"push"``, ``"pop"``, ``"domain"`` (created), ``"string"`` (registered) or ``"destroy"``
    (a domain). ``domain`` is the domain handle (0: the default domain). ``text`` is the message of a push, the
    name of a created domain or the registered string; None where a push names its message by a registered
    string, whose handle is then ``handle``. ``handle`` is also the handle a domain creation or string
    registration returned.
    """

    kind: str
    domain: int = 0
    text: str | None = None
    handle: int = 0


def _text(address, wide: bool) -> str:
    if not address:
        return ""
    if wide:
        return ctypes.wstring_at(address)
    return ctypes.string_at(address).decode(errors="replace")


def _message(attributes_address) -> tuple[str | None, int]:
    """(text, registered string handle) of an ``nvtxEventAttributes_t``."""
    if not attributes_address:
        return "", 0
    a = nvtxEventAttributes_v2.from_address(attributes_address)
    kind = a.messageType
    if kind == NVTX_MESSAGE_TYPE_REGISTERED:
        return None, a.message or 0
    if kind in (NVTX_MESSAGE_TYPE_ASCII, NVTX_MESSAGE_TYPE_UNICODE):
        return _text(a.message, kind == NVTX_MESSAGE_TYPE_UNICODE), 0
    return "", 0


def _returned(data: CUpti_NvtxData) -> int:
    """The handle an NVTX call returned (``functionReturnValue`` points at it)."""
    if not data.functionReturnValue:
        return 0
    return c_void_p.from_address(data.functionReturnValue).value or 0


def parse(cbid: int, address: int) -> NvtxCall | None:
    """The NVTX call a CUPTI NVTX callback describes (*address*: its ``CUpti_NvtxData``); None for other calls."""
    data = CUpti_NvtxData.from_address(address)
    params = data.functionParams
    if cbid in (CBID_nvtxRangePushA, CBID_nvtxRangePushW):
        return NvtxCall("push", 0, _text(_OneArg.from_address(params).arg, cbid == CBID_nvtxRangePushW))
    if cbid == CBID_nvtxRangePushEx:
        text, handle = _message(_OneArg.from_address(params).arg)
        return NvtxCall("push", 0, text, handle)
    if cbid == CBID_nvtxDomainRangePushEx:
        p = _DomainAndArg.from_address(params)
        text, handle = _message(p.arg)
        return NvtxCall("push", p.domain or 0, text, handle)
    if cbid == CBID_nvtxRangePop:
        return NvtxCall("pop")
    if cbid in (CBID_nvtxDomainRangePop, CBID_nvtxDomainDestroy):
        return NvtxCall("pop" if cbid == CBID_nvtxDomainRangePop else "destroy", _OneArg.from_address(params).arg or 0)
    if cbid in (CBID_nvtxDomainCreateA, CBID_nvtxDomainCreateW):
        name = _text(_OneArg.from_address(params).arg, cbid == CBID_nvtxDomainCreateW)
        return NvtxCall("domain", _returned(data), name, _returned(data))
    if cbid in (CBID_nvtxDomainRegisterStringA, CBID_nvtxDomainRegisterStringW):
        p = _DomainAndArg.from_address(params)
        return NvtxCall("string", p.domain or 0, _text(p.arg, cbid == CBID_nvtxDomainRegisterStringW), _returned(data))
    return None


class NvtxWatcher:
    """Hear this process's NVTX range pushes and pops, domain creations and string registrations while open.

    ``on_call(NvtxCall)`` runs on the thread that made the NVTX call, inside it: it must be quick and must not
    raise (an exception becomes a warning). Nothing arrives unless NVTX was routed to this libcupti
    (:data:`INJECTION_VAR`) before the calling library's first NVTX call.

    Raises
    ------
    ProfilerBusyError
        Another CUPTI callback subscriber exists in this process (CUPTI allows one).
    """

    def __init__(self, on_call):
        self._on_call = on_call
        callbacks.add_nvtx_watcher(self, CBIDS)
        self._open = True

    def _on_callback(self, cbid, address):
        try:
            call = parse(cbid, address)
            if call is not None:
                self._on_call(call)
        except Exception as exc:  # never raise into NVTX's caller
            warnings.warn(f"gpuscope NVTX callback failed: {exc!r}", GpuscopeWarning, stacklevel=1)

    @property
    def closed(self) -> bool:
        return not self._open

    def close(self) -> None:
        """Stop hearing NVTX calls (safe to call twice)."""
        if not self._open:
            return
        self._open = False
        callbacks.remove_nvtx_watcher(self, CBIDS)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

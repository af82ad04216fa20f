"""Readable kernel names from the symbols the driver reports.

Kernel-mode launches are named by their symbol: an Itanium-mangled C++ name for Numba and templated CuPy/C++
kernels, the plain name for ``extern "C"`` kernels (CuPy's elementwise and reduction kernels). One demangler reads
them: the toolchain's, libstdc++'s ``__cxa_demangle`` (the text ``c++filt`` prints), loaded with ctypes.
:func:`demangle` keeps the part the user wrote:

* Numba: ``_ZN8__main__6streamB2v1B94cw...E5ArrayIfLi1E1C7mutable7alignedE`` -> ``__main__.stream`` (module
  path and qualified function name joined by dots; ABI tags, which carry Numba's version and closure hash, and the
  argument types dropped; a kernel defined inside a function keeps its ``<locals>``:
  ``__main__.main.<locals>.fma``).
* C++: ``_ZN2ns6kernelIfLi4EEEvPT_`` -> ``ns::kernel<float, 4>`` (qualified name and template arguments as
  ``c++filt`` prints them, without return type and parameters).
* Anything else comes back unchanged.

What a user calls a kernel is shorter: :func:`short_name` is the function's own name (``fma``), and
:class:`KernelNames` names kernels with it, or, where two kernels share it, with as much of their qualified names
as tells them apart (``helper.<locals>.fma``). One table names the kernels of every Dataset a process makes
(:func:`kernel_names`: range results, PC samples, fast Top-Down, PM kernel executions), so a kernel has one name in
all of them and they join on it; each also keeps the qualified name in a column of its own (``kernel_qualname``).

Where libstdc++ cannot be loaded (no C++ runtime on the machine), a small parser of the name part of the Itanium
grammar stands in: nested names, ABI tags, template arguments with builtin, pointer, reference, cv-qualified,
class and literal arguments, substitutions and template parameters. It gives back unchanged every symbol it does
not follow (local names and lambdas, operator names, expressions), so that it never gives a wrong name; where it
answers it agrees with ``c++filt`` (``tests/unit/test_names.py`` checks both on real library symbols).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
import threading

__all__ = ["demangle", "demangled_text", "short_name", "brief_name", "numba_path", "KernelNames", "kernel_names",
           "kernel_name", "match_kernel"]


# ---------------------------------------------------------------------------------------------------------------
# The toolchain's demangler


@functools.cache
def _toolchain():
    """``(__cxa_demangle, free)`` from libstdc++ and libc, or None where libstdc++ cannot be loaded."""
    try:
        cxa_demangle = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6").__cxa_demangle
        free = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").free
    except (OSError, AttributeError):
        return None
    # char* __cxa_demangle(const char* mangled_name, char* output_buffer, size_t* length, int* status)
    cxa_demangle.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    cxa_demangle.restype = ctypes.c_void_p
    free.argtypes = [ctypes.c_void_p]
    free.restype = None
    return cxa_demangle, free


@functools.lru_cache(maxsize=4096)
def demangled_text(symbol: str) -> str:
    """*symbol* as ``c++filt`` prints it (libstdc++'s ``__cxa_demangle``), return type and parameters included.

    *symbol* itself when it is not mangled (``extern "C"`` names), when the demangler refuses it, or when
    libstdc++ cannot be loaded.
    """
    toolchain = _toolchain()
    if toolchain is None or not symbol.startswith("_Z"):
        return symbol
    cxa_demangle, free = toolchain
    status = ctypes.c_int(0)
    out = cxa_demangle(symbol.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not out:
        return symbol
    try:
        return ctypes.string_at(out).decode(errors="replace")
    finally:
        free(out)


_OPEN, _CLOSE = "<([{", ">)]}"
_ABI_TAG = re.compile(r"\[abi:([^\]]*)\]")
_TRAILING_QUALIFIERS = re.compile(r"(\s*(const|volatile|&&|&))+$")


def _split_top(text: str, sep: str) -> list[str]:
    """*text* split at *sep* outside brackets: ``a::b<c::d>::e`` -> ``['a', 'b<c::d>', 'e']``."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            i = start = i + len(sep)
            continue
        i += 1
    parts.append(text[start:])
    return parts


def _function_name(text: str) -> str:
    """``void ns::f<int>(int*)`` -> ``ns::f<int>``: the demangled text without return type and parameters."""
    head = _TRAILING_QUALIFIERS.sub("", text)
    if head.endswith(")"):  # the parameter list: the last bracketed group
        depth = 0
        for i in range(len(head) - 1, -1, -1):
            depth += head[i] in _CLOSE
            depth -= head[i] in _OPEN
            if depth == 0:
                head = head[:i]
                break
    return _split_top(head, " ")[-1]  # template functions carry their return type: "void ns::f<int>"


def _from_text(text: str) -> tuple[list[str], list[str]]:
    """(scope parts, ABI tags) of the function a demangled text names."""
    name = _function_name(text)
    return _split_top(_ABI_TAG.sub("", name), "::"), _ABI_TAG.findall(name)


# ---------------------------------------------------------------------------------------------------------------
# The fallback: a parser of the name part of the Itanium grammar

_BUILTIN = {
    "v": "void", "w": "wchar_t", "b": "bool", "c": "char", "a": "signed char", "h": "unsigned char", "s": "short",
    "t": "unsigned short", "i": "int", "j": "unsigned int", "l": "long", "m": "unsigned long", "x": "long long",
    "y": "unsigned long long", "n": "__int128", "o": "unsigned __int128", "f": "float", "d": "double",
    "e": "long double", "g": "__float128", "z": "...",
}
_BUILTIN_D = {"Dh": "half", "Dn": "decltype(nullptr)", "Di": "char32_t", "Ds": "char16_t", "Du": "char8_t",
              "DF16_": "_Float16"}
_STD_SUBST = {"St": "std", "Sa": "std::allocator", "Sb": "std::basic_string", "Ss": "std::string",
              "Si": "std::istream", "So": "std::ostream", "Sd": "std::iostream"}
# literal suffixes as c++filt prints them
_LITERAL_SUFFIX = {"j": "u", "l": "l", "m": "ul", "x": "ll", "y": "ull"}


class _Unsupported(Exception):
    """A construct this parser does not follow: the symbol is returned unchanged."""


class _Parser:
    def __init__(self, text: str):
        self.s, self.i = text, 0
        self.subs: list[str] = []
        self.template_args: list[str] = []
        self.abi_tags: list[str] = []

    def peek(self, n: int = 1) -> str:
        return self.s[self.i:self.i + n]

    def take(self, token: str) -> bool:
        if self.s.startswith(token, self.i):
            self.i += len(token)
            return True
        return False

    def number(self) -> int:
        m = re.compile(r"n?\d+").match(self.s, self.i)
        if not m:
            raise _Unsupported(self.i)
        self.i = m.end()
        text = m.group(0)
        return -int(text[1:]) if text.startswith("n") else int(text)

    def source_name(self) -> str:
        n = self.number()
        if n <= 0 or self.i + n > len(self.s):
            raise _Unsupported(self.i)
        name = self.s[self.i:self.i + n]
        self.i += n
        return "(anonymous namespace)" if name.startswith("_GLOBAL__N") else name

    def abi_tag_list(self) -> None:
        while self.take("B"):
            self.abi_tags.append(self.source_name())

    def seq_id(self, closing: str = "_") -> int:
        """``S_`` is 0, ``S0_`` is 1, ``SA_`` is 11 (base 36)."""
        m = re.compile(r"[0-9A-Z]*" + closing).match(self.s, self.i)
        if not m:
            raise _Unsupported(self.i)
        self.i = m.end()
        digits = m.group(0)[:-1]
        return 0 if not digits else int(digits, 36) + 1

    def substitution(self) -> str:
        for token, text in _STD_SUBST.items():
            if self.take(token):
                return text
        if not self.take("S"):
            raise _Unsupported(self.i)
        index = self.seq_id()
        if index >= len(self.subs):
            raise _Unsupported(self.i)
        return self.subs[index]

    def template_param(self) -> str:
        self.take("T")
        index = self.seq_id()
        if index >= len(self.template_args):
            raise _Unsupported(self.i)
        return self.template_args[index]

    def unqualified(self) -> str:
        if self.peek().isdigit():
            name = self.source_name()
        elif self.peek(2) in ("C1", "C2", "C3", "D0", "D1", "D2"):
            raise _Unsupported(self.i)  # constructors and destructors are not kernels
        else:
            raise _Unsupported(self.i)  # operator names, unnamed types, lambdas
        self.abi_tag_list()
        return name

    def template_args_list(self) -> list[str]:
        if not self.take("I"):
            raise _Unsupported(self.i)
        args = []
        while not self.take("E"):
            args.append(self.template_arg())
        return args

    def template_arg(self) -> str:
        if self.take("L"):
            return self.literal()
        if self.take("J"):  # an argument pack
            parts = []
            while not self.take("E"):
                parts.append(self.template_arg())
            return ", ".join(parts)
        if self.peek() == "X":
            raise _Unsupported(self.i)  # expressions
        return self.type()

    def literal(self) -> str:
        if self.take("_Z"):
            raise _Unsupported(self.i)  # external names as arguments
        code = self.peek()
        if code not in _BUILTIN:
            raise _Unsupported(self.i)
        self.i += 1
        value = self.number()
        self.take("E") or self._fail()
        if code == "b":
            return "true" if value else "false"
        if code in "ilsc":
            return str(value) if code in "il" else f"({_BUILTIN[code]}){value}"
        suffix = _LITERAL_SUFFIX.get(code)
        return f"{value}{suffix}" if suffix is not None else f"({_BUILTIN[code]}){value}"

    def _fail(self):
        raise _Unsupported(self.i)

    def type(self) -> str:
        code = self.peek()
        if code in _BUILTIN:
            self.i += 1
            return _BUILTIN[code]
        for token, text in _BUILTIN_D.items():
            if self.take(token):
                return text
        for prefix, fmt in (("P", "{}*"), ("R", "{}&"), ("O", "{}&&"), ("K", "{} const"), ("V", "{} volatile"),
                            ("r", "{} restrict")):
            if self.take(prefix):
                inner = self.type()
                text = fmt.format(inner)
                self.subs.append(text)
                return text
        if code == "T":
            text = self.template_param()
            if self.peek() == "I":
                self.subs.append(text)
                text += self.format_args(self.template_args_list())
            self.subs.append(text)
            return text
        if code == "S" and self.peek(2) not in _STD_SUBST:
            text = self.substitution()
            if self.peek() == "I":
                text += self.format_args(self.template_args_list())
                self.subs.append(text)
            return text
        nested = self.peek() == "N"
        text = self.name()  # class and enum types: a (nested) name
        if not nested:  # nested() has added the whole name already, as its last prefix
            self.subs.append(text)
        return text

    @staticmethod
    def format_args(args: list[str]) -> str:
        inner = ", ".join(args)
        return f"<{inner} >" if inner.endswith(">") else f"<{inner}>"

    def nested(self) -> list[str]:
        """``N [K|V|r]* <prefix> E`` -> scope parts; template arguments are appended to their part."""
        while self.peek() in ("K", "V", "r"):
            self.i += 1
        parts: list[str] = []
        while not self.take("E"):
            if self.peek() == "I":
                if not parts:
                    self._fail()
                args = self.template_args_list()
                self.template_args = args
                parts[-1] += self.format_args(args)
            elif self.peek() == "S":
                parts.append(self.substitution())
                continue  # a substitution is already in the table
            elif self.peek() == "T":
                parts.append(self.template_param())
            else:
                parts.append(self.unqualified())
            self.subs.append("::".join(parts))
        return parts

    def name(self) -> str:
        if self.take("N"):
            return "::".join(self.nested())
        if self.peek() == "Z":
            raise _Unsupported(self.i)  # local names (functions inside functions)
        if self.peek() == "S":
            std = self.peek(2) == "St"
            head = self.substitution() if not std else (self.take("St") and "std::" + self.unqualified())
        else:
            head = self.unqualified()
        if self.peek() == "I":
            self.subs.append(head)
            args = self.template_args_list()
            self.template_args = args
            head += self.format_args(args)
        return head



_NUMBA_ESCAPE = re.compile(r"_([0-7][0-9a-f])")


def _numba_unescape(part: str) -> str:
    """Numba writes characters outside ``[A-Za-z0-9_]`` as ``_<hex>`` (``<locals>`` is ``_3clocals_3e``)."""

    def repl(m):
        ch = chr(int(m.group(1), 16))
        return m.group(0) if ch.isalnum() or ch == "_" else ch

    return _NUMBA_ESCAPE.sub(repl, part)


def _is_numba(parts: list[str], tags: list[str]) -> bool:
    # Numba tags every function with its ABI version ("v1", "v2", ...) and, since 0.57, its closure ("cw...").
    return (bool(parts) and parts[0] == "cudapy") or any(t.startswith("cw") for t in tags) or (
        any(re.fullmatch(r"v\d+", t) for t in tags) and len(parts) >= 2)


def _fallback(symbol: str) -> tuple[list[str], list[str]] | None:
    """(scope parts, ABI tags) from the parser above, or None for a symbol it does not follow."""
    p = _Parser(symbol)
    p.i = 2
    try:
        parts = p.nested() if p.take("N") else [p.name()]
    except (_Unsupported, IndexError, ValueError):
        return None
    return parts, p.abi_tags


def _parts(symbol: str) -> tuple[list[str], bool] | None:
    """(scope parts, whether it is a Numba kernel) of a mangled *symbol*, or None where it cannot be read."""
    if _toolchain() is None:
        found = _fallback(symbol)
    else:
        text = demangled_text(symbol)
        found = None if text == symbol else _from_text(text)
    if found is None or not all(found[0]):
        return None
    parts, tags = found
    if not _is_numba(parts, tags):
        return parts, False
    parts = parts[1:] if parts[0] == "cudapy" and len(parts) > 1 else parts
    return [_numba_unescape(x) for x in parts], True


@functools.lru_cache(maxsize=4096)
def demangle(symbol: str) -> str:
    """The readable, qualified name of a kernel symbol.

    Parameters
    ----------
    symbol : str
        The symbol as the driver or CUPTI reports it.

    Returns
    -------
    str
        ``module.function`` for Numba kernels (``module.outer.<locals>.function`` for one defined inside a
        function), ``ns::function<args>`` for other C++ kernels, *symbol* itself for ``extern "C"`` names and for
        mangled names that cannot be read.

    Examples
    --------
    >>> demangle("_ZN8__main__6streamB2v1B4cw51E5ArrayIfLi1E1C7mutable7alignedE")
    '__main__.stream'
    >>> demangle("_Z9my_kernelIfEvPT_")
    'my_kernel<float>'
    >>> demangle("cupy_add")
    'cupy_add'
    """
    if not symbol.startswith("_Z"):
        return symbol
    found = _parts(symbol)
    if found is None:
        return symbol
    parts, numba = found
    return ".".join(parts) if numba else "::".join(parts)


def numba_path(symbol: str) -> list[str]:
    """``[module..., function]`` of a Numba kernel symbol (``<locals>`` parts included), ``[]`` for other names."""
    found = _parts(symbol) if symbol.startswith("_Z") else None
    return found[0] if found is not None and found[1] else []


def short_name(name: str) -> str:
    """What a user calls a kernel, from its :func:`demangle` name: the function of a Numba name (``fma`` for
    ``__main__.main.<locals>.fma``); C++ and ``extern "C"`` names as they are.

    >>> short_name("__main__.main.<locals>.fma")
    'fma'
    """
    if "::" in name or "." not in name:
        return name
    return name.rsplit(".", 1)[-1]


def brief_name(name: str) -> str:
    """A kernel's name short enough for a legend or a title: :func:`short_name`, and of a C++ name the function
    alone, without its scope and template arguments.

    >>> brief_name("cub::detail::reduce::DeviceReduceKernel<cub::detail::reduce::policy_hub<float>, float*>")
    'DeviceReduceKernel'
    """
    name = short_name(name)
    last = _split_top(name, "::")[-1]
    return last.split("<", 1)[0] or name


def _endings(qualname: str) -> list[str]:
    """The dotted endings of a Numba name, shortest first, none starting at ``<locals>``:
    ``a.main.<locals>.fma`` -> ``fma``, ``main.<locals>.fma``, ``a.main.<locals>.fma``."""
    if "::" in qualname or "." not in qualname:
        return [qualname]
    parts = qualname.split(".")
    return [".".join(parts[-k:]) for k in range(1, len(parts) + 1) if parts[-k] != "<locals>"]


class KernelNames:
    """Names of kernels (a process's: :func:`kernel_names`): short where that is unambiguous, longer only where
    needed.

    A kernel (told apart by its qualified name) is called by its short name unless another kernel has that name
    already; then by the shortest ending of its qualified name that no other kernel has (``helper.<locals>.fma``
    beside ``fma``), at worst the qualified name with a number. A kernel keeps the name it got first, so rows
    already recorded never change name. Thread-safe.

    Examples
    --------
    >>> names = KernelNames()
    >>> names.name("__main__.main.<locals>.fma"), names.name("__main__.helper.<locals>.fma")
    ('fma', 'helper.<locals>.fma')
    """

    def __init__(self):
        self._given: dict[str, str] = {}  # qualified name -> its name
        self._owner: dict[str, str] = {}  # name -> the qualified name it was given to
        self._lock = threading.Lock()

    def name(self, qualname: str, short: str | None = None) -> str:
        """The name of the kernel *qualname* (a :func:`demangle` name); *short* is the name to prefer (default
        :func:`short_name`; e.g. a decorated kernel's own name)."""
        with self._lock:
            given = self._given.get(qualname)
            if given is None:
                candidates = [short or short_name(qualname), *_endings(qualname)]
                given = next((c for c in candidates if c not in self._owner), None)
                number = 2
                while given is None or given in self._owner:
                    given, number = f"{qualname} ({number})", number + 1
                self._given[qualname], self._owner[given] = given, qualname
            return given


_process_names = KernelNames()


def kernel_names() -> KernelNames:
    """The kernel names of this process: every collector names the kernels of its Dataset with this one table, so
    that a kernel has the same name in range results, PC samples, fast Top-Down and PM kernel executions, and two
    kernels never share a name in any of them."""
    return _process_names


def kernel_name(symbol: str) -> str:
    """The name of the kernel *symbol* (as the driver or CUPTI reports it) in this process (:func:`kernel_names`);
    ``""`` for ``""``."""
    return _process_names.name(demangle(symbol)) if symbol else ""


def _fresh_lock_in_child() -> None:  # a thread of the parent may have held the table's lock at the fork
    _process_names._lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_in_child)


def match_kernel(name: str, names, symbols=None) -> str | None:
    """The one entry of *names* that is the kernel *name*, or None.

    Tried in order: *name* as a symbol in *symbols* (symbol -> name), *name* itself, then one unique entry with
    the same last dotted part (``module.stream`` and ``stream``: Numba names carry their module, decorated
    kernels and other tools may not).

    Examples
    --------
    >>> match_kernel("__main__.stream", ["stream", "fma"])
    'stream'
    >>> match_kernel("fma", ["a.fma", "b.fma"]) is None
    True
    """
    names = list(names)
    if symbols and name in symbols:
        return symbols[name]
    if name in names:
        return name
    tail = name.rsplit(".", 1)[-1]
    hits = [n for n in names if n.rsplit(".", 1)[-1] == tail]
    return hits[0] if len(hits) == 1 else None


"""Readable kernel names from the symbols the driver reports, in pure Python.

Kernel-mode launches are named by their symbol: an Itanium-mangled C++ name for Numba and templated CuPy/C++
kernels, the plain name for ``extern "C"`` kernels (CuPy's elementwise and reduction kernels). :func:`demangle`
turns them into what the user wrote:

* Numba: ``_ZN8__main__6streamB2v1B94cw...E5ArrayIfLi1E1C7mutable7alignedE`` -> ``__main__.stream`` (module
  path and function joined by dots; ABI tags, which carry Numba's version and closure hash, and the argument types
  dropped; ``<locals>`` of nested functions kept).
* C++: ``_ZN2ns6kernelIfLi4EEEvPT_`` -> ``ns::kernel<float, 4>`` (qualified name and template arguments, no return
  type or parameters).
* Anything else, and any mangled name this parser does not follow, comes back unchanged.

Only the name part of the Itanium grammar is parsed (nested names, ABI tags, template arguments with builtin,
pointer, reference, cv-qualified, class and literal arguments, substitutions and template parameters).
"""

from __future__ import annotations

import functools
import re

__all__ = ["demangle"]

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
        return name

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
        text = self.name()  # class and enum types: a (nested) name
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


@functools.lru_cache(maxsize=4096)
def demangle(symbol: str) -> str:
    """The readable name of a kernel symbol.

    Parameters
    ----------
    symbol : str
        The symbol as the driver or CUPTI reports it.

    Returns
    -------
    str
        ``module.function`` for Numba kernels, ``ns::function<args>`` for other C++ kernels, *symbol* itself for
        ``extern "C"`` names and for mangled names this parser does not follow.

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
    p = _Parser(symbol)
    p.i = 2
    try:
        if p.take("N"):
            parts = p.nested()
        else:
            parts = [p.name()]
    except (_Unsupported, IndexError, ValueError):
        return symbol
    if _is_numba(parts, p.abi_tags):
        parts = parts[1:] if parts[0] == "cudapy" and len(parts) > 1 else parts
        return ".".join(_numba_unescape(x) for x in parts)
    return "::".join(parts)


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


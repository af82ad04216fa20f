"""Relocatable device code read from real cubins (H100 fixtures), and the kernel-replay cost warning that states only
what was observed (no GPU)."""

import gzip
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from gpuscope._gpu import modules as _modules
from gpuscope._range_profiling import session as _session
from gpuscope.errors import GpuscopeWarning

CUBINS = Path(__file__).resolve().parents[1] / "fixtures" / "cubins"


def cubin(name: str) -> bytes:
    return gzip.decompress((CUBINS / f"{name}.cubin.gz").read_bytes())


def test_a_whole_program_module_has_no_evidence():
    assert _modules.relocatable_evidence(cubin("cupy_plain_sm90")) == []
    assert _modules.kernel_names(cubin("cupy_plain_sm90")) == ["plain"]


@pytest.mark.parametrize("name, kernel", [("cupy_rdc_linked_sm90", "plain"), ("numba_gridsync_sm90", "_ZN8__main__")])
def test_modules_linked_from_relocatable_code_are_recognised(name, kernel):
    evidence = _modules.relocatable_evidence(cubin(name))
    assert evidence[0] == "linked by the JIT linker from objects compiled with ptxas -c (relocatable)"
    assert "links the CUDA device runtime" in evidence
    assert evidence[-1].startswith("keeps relocations (.nv.rel.action")
    names = _modules.kernel_names(cubin(name))
    assert len(names) == 1 and names[0].startswith(kernel)  # the device runtime's own functions are left out


def test_a_cooperative_groups_object_before_linking_keeps_relocations():
    assert _modules.relocatable_evidence(cubin("cupy_cooperative_prelink_sm90")) == [
        "keeps relocations (.rela.nv.constant4)"]


@pytest.mark.parametrize("data", [b"", b"not an elf", b"\x7fELF" + b"\0" * 60, cubin("cupy_plain_sm90")[:200]])
def test_anything_else_is_not_relocatable_and_does_not_raise(data):
    assert _modules.relocatable_evidence(data) == [] and _modules.kernel_names(data) == []


def crafted_cubin(shared_name: bool, size: int = 1_440_000, count: int = 11_000) -> bytes:
    """An ELF header, *count* section headers that each span nearly the whole file, and a string table that ends
    it. *shared_name*: every section is a toolkit note (each one's contents were copied, then joined); else each
    names a different offset of a table with no NUL but its last byte, and holds no contents (NOBITS): each name
    was read to the end of the file."""
    table_at = 64 + count * 64
    table = b".note.nv.tkinfo\0".ljust(size - table_at, b"A") if shared_name else b"A" * (size - table_at - 1) + b"\0"
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"  # 64-bit, little-endian
    struct.pack_into("<Q", header, 40, 64)  # section headers right after this header
    struct.pack_into("<HHH", header, 58, 64, count, 0)  # their size and count; section 0 holds the names
    section = struct.Struct("<IIQQQQIIQQ").pack  # name, type, flags, address, offset, size, link, info, align, entry
    sections = [section(0, 3, 0, 0, table_at, len(table), 0, 0, 1, 0)]
    sections += [section(0, 1, 0, 0, 1, size - 1, 0, 0, 1, 0) if shared_name  # contents: every note
                 else section(i, 8, 0, 0, 1, size - 1, 0, 0, 1, 0) for i in range(1, count)]  # no contents: the names
    return bytes(header) + b"".join(sections) + table


READ_UNDER_A_MEMORY_LIMIT = """
import resource, sys, time
from gpuscope._gpu import modules
data = open(sys.argv[1], "rb").read()
with open("/proc/self/status") as status:
    kib = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, ((kib << 10) + (512 << 20),) * 2)  # 512 MiB more than now
start = time.monotonic()
found = modules.relocatable_evidence(data), modules.kernel_names(data)
print(found, round(time.monotonic() - start, 2))
"""


@pytest.mark.parametrize("shared_name", [False, True], ids=["names-to-the-end", "notes-spanning-the-file"])
def test_a_crafted_cubin_costs_little_memory_and_time(tmp_path, shared_name):
    """A 1.44 MB cubin took 7.6 GB and 14 s inside CUPTI's module-load callback: each of its 11,000 section names was
    read to the end of the file, and each section's contents copied. Under 512 MiB more than at the start, it is
    now read in well under a second, and shows no evidence and no kernel."""
    path = tmp_path / "crafted.cubin"
    path.write_bytes(crafted_cubin(shared_name))
    assert path.stat().st_size == 1_440_000
    out = subprocess.run([sys.executable, "-c", READ_UNDER_A_MEMORY_LIMIT, str(path)], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    found, seconds = out.stdout.rsplit(" ", 1)
    assert found == "([], [])" and float(seconds) < 1.0


def test_loads_heard_are_counted(monkeypatch):
    seen = _modules.Seen()
    monkeypatch.setattr(_modules, "_seen", seen)
    _modules._on_loaded(1, cubin("cupy_plain_sm90"))
    _modules._on_loaded(2, cubin("cupy_rdc_linked_sm90"))
    assert seen.loaded == 2 and len(seen.relocatable) == 1
    assert seen.relocatable[0][0] == ["plain"]


class Replay:
    """The part of a kernel-mode Profiler the cost warning reads."""

    passes, device = 7, 0
    _warn_replay_cost = _session.Profiler._warn_replay_cost

    def __init__(self):
        self._notes = {}


def warned(monkeypatch, ms, device_gib, own_gib, seen, judged=None):
    monkeypatch.setattr("gpuscope._gpu.device.memory_used_gib", lambda index: device_gib)
    monkeypatch.setattr("gpuscope._gpu.device.process_memory_gib", lambda index: own_gib)
    monkeypatch.setattr(_modules, "_seen", seen)
    replay = Replay()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        replay._warn_replay_cost(ms, judged)
    return [str(w.message) for w in caught if issubclass(w.category, GpuscopeWarning)], replay._notes


def watching(relocatable=()):
    seen = _modules.Seen()
    seen.watching, seen.loaded, seen.relocatable = True, 5, list(relocatable)
    return seen


def test_expected_cost_says_nothing(monkeypatch):
    assert warned(monkeypatch, 40.0, 0.7, 0.5, watching())[0] == []


def test_memory_held_by_this_process_is_named(monkeypatch):
    texts, notes = warned(monkeypatch, 104.0, 17.0, 16.2, watching())
    assert len(texts) == 1 and "this process holds 16.2 GiB of device memory in use" in texts[0]
    assert "relocatable" not in texts[0] and "unknown" not in texts[0]
    assert notes == {"replay_memory_gib": 16.2, "replay_memory_scope": "process", "relocatable_modules": 0}


def test_a_relocatable_module_seen_is_named_with_its_kernel(monkeypatch):
    rdc = [(["_Z3cgkPfPii"], ["links the CUDA device runtime"])]
    texts, _ = warned(monkeypatch, 89.0, 1.0, None, watching(rdc))
    assert len(texts) == 1
    assert "1 loaded module(s) were built with relocatable device code (cgk: links the CUDA device runtime)" in texts[0]
    assert "unknown" not in texts[0]


def test_no_cause_seen_says_unknown_with_the_numbers(monkeypatch):
    texts, notes = warned(monkeypatch, 150.0, 16.5, None, watching())
    assert len(texts) == 1 and "the device has 16.5 GiB of device memory in use" in texts[0]
    texts, notes = warned(monkeypatch, 150.0, 1.0, 0.8, watching())
    assert "the cause is unknown: this process holds 0.8 GiB in use (about 38 ms expected" in texts[0]
    assert "none of the 5 module(s) loaded while gpuscope sessions were open" in texts[0]
    assert notes["replay_memory_scope"] == "process"
    unwatched = _modules.Seen()
    unwatched.error = "ProfilerBusyError: another subscriber"
    texts, _ = warned(monkeypatch, 150.0, 1.0, 0.8, unwatched)
    assert "the loaded modules could not be inspected (ProfilerBusyError: another subscriber)" in texts[0]


def test_a_dear_time_on_one_or_two_launches_alone_is_not_warned_about(monkeypatch):
    """The second launch after CUPTI was detached took 147 ms on the H100, the ones after it 40: a time alone is
    judged on three launches after the first; memory held or a relocatable module is named whatever the count."""
    assert warned(monkeypatch, 150.0, 1.0, 0.8, watching(), judged=1)[0] == []
    assert len(warned(monkeypatch, 150.0, 1.0, 0.8, watching(), judged=3)[0]) == 1
    assert len(warned(monkeypatch, 40.0, 17.0, 16.2, watching(), judged=1)[0]) == 1
    rdc = [(["_Z3cgkPfPii"], ["links the CUDA device runtime"])]
    assert len(warned(monkeypatch, 89.0, 1.0, None, watching(rdc), judged=1)[0]) == 1  # a cause seen is named

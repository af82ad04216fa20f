"""On/off environment variables read alike (gpuscope/_util/env.py): every spelling of on and off, for each of
GPUSCOPE_RESULTS_PROCESS, GPUSCOPE_FIRST_START_BESIDE and GPUSCOPE_PC_DETACH, and a warning for anything else."""

import pytest

from gpuscope._commands import run as _run
from gpuscope._gpu import keep as _keep
from gpuscope._util import env as _env
from gpuscope.errors import GpuscopeWarning

NAME = "GPUSCOPE_TEST_FLAG"


@pytest.mark.parametrize("text", ["1", "true", "Yes", " ON "])
def test_every_spelling_of_on(monkeypatch, text):
    monkeypatch.setenv(NAME, text)
    assert _env.flag(NAME, False) is True


@pytest.mark.parametrize("text", ["0", "False", "no", "OFF "])
def test_every_spelling_of_off(monkeypatch, text):
    monkeypatch.setenv(NAME, text)
    assert _env.flag(NAME, True) is False


def test_unset_or_empty_is_the_default_and_anything_else_is_warned_about_once(monkeypatch, recwarn):
    monkeypatch.delenv(NAME, raising=False)
    assert _env.flag(NAME, True) is True and _env.flag(NAME, False) is False
    monkeypatch.setenv(NAME, " ")
    assert _env.flag(NAME, True) is True
    monkeypatch.setenv(NAME, "nope")
    with pytest.warns(GpuscopeWarning, match=r"GPUSCOPE_TEST_FLAG='nope' is neither on \(1, true, yes, on\) nor off "
                                             r"\(0, false, no, off\): using the default, on"):
        assert _env.flag(NAME, True) is True
    assert _env.flag(NAME, True) is True and not recwarn  # once per value


class Recorded:  # a Profiler that gives its Dataset's inputs: made in a results process unless turned off
    dataset_inputs = staticmethod(lambda: None)


@pytest.mark.parametrize("text", ["0", "off", "false", "no"])
def test_results_process_off_in_every_spelling(monkeypatch, text):
    monkeypatch.setenv(_run.RESULTS_PROCESS_VAR, text)
    assert _run._results_worker(_run.RunOptions(script="s.py"), Recorded) is None


@pytest.mark.parametrize("text", ["0", "off", "false", "no"])
def test_pc_detach_off_in_every_spelling(monkeypatch, text):
    monkeypatch.setattr(_keep._api, "attached", lambda: True)
    monkeypatch.setenv(_keep.DETACH_ENV, text)
    assert _keep.detach_cupti() == "off (GPUSCOPE_PC_DETACH=0)"

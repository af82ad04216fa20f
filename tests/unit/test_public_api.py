"""The public API is pinned: ``gpuscope.__all__`` and every public name's signature match
``tests/unit/data/public_api.json``, and ``docs/api.rst`` documents every public name under its public path.

A deliberate change to the API updates the pin: ``python tests/unit/test_public_api.py --update``.
"""

import inspect
import json
import re
import sys
from pathlib import Path

import gpuscope

ROOT = Path(__file__).resolve().parents[2]
PIN = Path(__file__).parent / "data" / "public_api.json"


def current() -> dict:
    out = {}
    for name in gpuscope.__all__:
        if name == "__version__":
            continue
        obj = getattr(gpuscope, name)
        if inspect.isclass(obj):
            kind = "exception" if issubclass(obj, BaseException) else "class"
            try:
                sig = str(inspect.signature(obj)) if kind == "class" else ""
            except (TypeError, ValueError):
                sig = ""
        else:
            kind, sig = "function", str(inspect.signature(obj))
        out[name] = f"{kind} {sig}".strip()
    return out


def test_the_public_names_and_signatures_are_the_pinned_ones():
    pinned = json.loads(PIN.read_text())
    now = current()
    added, gone = sorted(set(now) - set(pinned)), sorted(set(pinned) - set(now))
    changed = {n: (pinned[n], now[n]) for n in set(now) & set(pinned) if now[n] != pinned[n]}
    assert not (added or gone or changed), (
        f"the public API changed: added {added}, removed {gone}, changed {changed}. If that is meant, run "
        "`python tests/unit/test_public_api.py --update` and say so in the change.")


def test_the_api_reference_documents_every_public_name_under_its_public_path():
    text = (ROOT / "docs" / "api.rst").read_text()
    documented = set(re.findall(r"^\.\. auto\w+:: gpuscope\.(\w+)$", text, re.M))
    missing = [n for n in gpuscope.__all__ if n != "__version__" and n not in documented]
    assert not missing, f"docs/api.rst lacks {missing} (as `.. autofunction:: gpuscope.<name>` or autoclass)"
    private = re.findall(r"^\.\. auto\w+:: (gpuscope(?:\.\w+)*\._\w+.*)$", text, re.M)
    assert not private, f"docs/api.rst documents private paths: {private}"


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    PIN.write_text(json.dumps(current(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {PIN}")

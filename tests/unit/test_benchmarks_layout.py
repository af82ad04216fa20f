"""Issue 37, item 13: investigation probes live in benchmarks/probes/ with a README; every benchmarks/ path the
repository names exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def test_probes_are_in_their_folder_and_each_is_described():
    assert not list(BENCH.glob("probe_*.py"))
    readme = (BENCH / "probes" / "README.md").read_text()
    measurements = (ROOT / "docs" / "measurements.md").read_text()
    probes = sorted(p.name for p in (BENCH / "probes").glob("probe_*.py"))
    assert probes and all(f"`{p}`" in readme and p in measurements for p in probes)


def test_every_benchmarks_path_named_in_the_repository_exists():
    named = set()
    for folder in ("gpuscope", "docs", "tests", "benchmarks", "tutorials", "tools"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md", ".sh") and path.is_file():
                named |= set(re.findall(r"benchmarks/[\w/]+\.(?:py|sh|json)", path.read_text(errors="replace")))
    assert named and sorted(n for n in named if not (ROOT / n).exists()) == []

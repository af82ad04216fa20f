"""Issue 54: benchmarks/ holds the scripts that make documented figures, each listed in its README with the figure
and the command; the investigations are in probes/, each with what it found; every such path the repository names
exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
PROBES = ROOT / "probes"


def _scripts(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.suffix in (".py", ".sh") and p.name != "__init__.py"}


def test_probes_are_in_their_folder_and_each_says_what_it_found():
    assert not list(BENCH.rglob("probe_*.py")) and not (BENCH / "probes").exists()
    readme = (PROBES / "README.md").read_text()
    measurements = (ROOT / "docs" / "measurements.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(probe_\w+\.py)`[^|]*\| ([^|]+) \|", readme, re.M)}
    probes = sorted(p.name for p in PROBES.glob("probe_*.py"))
    assert probes and sorted(rows) == probes
    assert all(f"probes/{p}" in measurements for p in probes)
    assert all(len(found.split()) >= 8 for found in rows.values())  # a finding, not a placeholder


def test_every_script_of_benchmarks_is_in_its_readme_and_every_command_runs_one():
    readme = (BENCH / "README.md").read_text()
    listed = set(re.findall(r"`([\w]+\.(?:py|sh))`", readme))
    scripts = _scripts(BENCH)
    assert sorted(scripts - listed) == []  # nothing in benchmarks/ that the README does not place
    commands = re.findall(r"`(?:python3?|bash) (benchmarks/[\w/]+\.(?:py|sh))", readme)
    assert commands and sorted(c for c in commands if not (ROOT / c).exists()) == []
    figures = [line for line in readme.splitlines() if line.startswith("| ") and "`benchmarks/" in line]
    assert all(line.count("|") == 4 for line in figures)  # figure | script | command


def test_every_benchmark_the_docs_cite_is_listed_with_a_figure():
    readme = (BENCH / "README.md").read_text()
    table = "\n".join(line for line in readme.splitlines() if line.startswith("| "))
    cited = set()
    for page in (ROOT / "docs").glob("*.md"):
        cited |= set(re.findall(r"benchmarks/(\w+\.py)", page.read_text()))
    shared = {"workloads.py", "short_kernels.py"}
    assert cited and sorted(c for c in cited - shared if f"`{c}`" not in table) == []


def test_every_benchmarks_or_probes_path_named_in_the_repository_exists():
    named = set()
    for folder in ("gpuscope", "docs", "tests", "benchmarks", "probes", "tutorials", "tools"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md", ".sh") and path.is_file():
                text = path.read_text(errors="replace")
                named |= set(re.findall(r"(?<![\w/])(?:benchmarks|probes)/[\w/]+\.(?:py|sh|json)", text))
    assert named and sorted(n for n in named if not (ROOT / n).exists()) == []

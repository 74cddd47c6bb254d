#!/usr/bin/env python3
"""Put the committed benchmark tables into the README and the rounds pages beside the results: the
text between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->` becomes `bench/results/NAME.md`.

    python scripts/readme_tables.py           # rewrite the documents in place
    python scripts/readme_tables.py --check   # exit 1 if any section differs from its results file
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SECTION = re.compile(r"(<!-- bench:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.S)


def render(readme: str, results: Path) -> str:
    def fill(match: re.Match[str]) -> str:
        path = results / f"{match['name']}.md"
        if not path.exists():  # not measured yet: the section stays as it is (and --check fails)
            return match.group(0)
        return f"{match.group(1)}{path.read_text().rstrip()}\n{match.group(4)}"
    return SECTION.sub(fill, readme)


def documents() -> list[Path]:
    """The README, and the pages that keep each benchmark round's story so the README can stay short."""
    return [ROOT / "README.md", *sorted((RESULTS / "strategy_rounds").glob("*.md"))]


def main(argv: list[str]) -> int:
    stale = []
    for path in documents():
        current = path.read_text()
        wanted = render(current, RESULTS)
        missing = [m["name"] for m in SECTION.finditer(current) if not (RESULTS / f"{m['name']}.md").exists()]
        if "--check" in argv:
            if wanted != current or missing:
                stale.append(f"{path.relative_to(ROOT)}" + (f" (no results file for {', '.join(missing)})"
                                                            if missing else ""))
        elif wanted != current:
            path.write_text(wanted)
    if stale:
        print(f"benchmark sections differ from bench/results/*.md in {'; '.join(stale)}: "
              "run python scripts/readme_tables.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

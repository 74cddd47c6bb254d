#!/usr/bin/env python3
"""Put the committed benchmark tables into the README: the text between
`<!-- bench:NAME -->` and `<!-- /bench:NAME -->` becomes `bench/results/NAME.md`.

    python scripts/readme_tables.py           # rewrite README.md in place
    python scripts/readme_tables.py --check   # exit 1 if any section differs from its results file
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = re.compile(r"(<!-- bench:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.S)


def render(readme: str, results: Path) -> str:
    def fill(match: re.Match[str]) -> str:
        path = results / f"{match['name']}.md"
        if not path.exists():  # not measured yet: the section stays as it is (and --check fails)
            return match.group(0)
        return f"{match.group(1)}{path.read_text().rstrip()}\n{match.group(4)}"
    return SECTION.sub(fill, readme)


def main(argv: list[str]) -> int:
    path = ROOT / "README.md"
    current = path.read_text()
    wanted = render(current, ROOT / "bench" / "results")
    if "--check" in argv:
        missing = [m["name"] for m in SECTION.finditer(current)
                   if not (ROOT / "bench" / "results" / f"{m['name']}.md").exists()]
        if wanted != current or missing:
            print("README.md's benchmark sections differ from bench/results/*.md: "
                  "run python scripts/readme_tables.py", file=sys.stderr)
            return 1
        return 0
    path.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Whether the real BIG-bench task files are on this machine, for the tests that read them.

The set-up takes them from the package index's `bigbench==1.0.0` sdist. Where the index no longer
serves it, the set-up goes on without them (scripts/fetch_bigbench.py exits 3 and says why), and
these tests are skipped with that reason instead of failing on a machine that cannot have the
files. The fetch script and the loader are still tested there, on task files the tests write."""

from __future__ import annotations

import pytest

from ecdysis.suites.bigbench import bigbench_dir

REAL = bigbench_dir()
HERE = (REAL / "date_understanding" / "task.json").is_file()
needs_bigbench = pytest.mark.skipif(
    not HERE, reason=f"the real BIG-bench task files are not in {REAL} (scripts/fetch_bigbench.py: the package "
                     "index may no longer serve bigbench==1.0.0; --source DIR adds them from a checkout)")

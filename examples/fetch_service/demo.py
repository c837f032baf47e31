"""``make demo``: the partitioned Fetch Service end to end, with two kill -9s.

Every piece is its own process (:mod:`examples.fetch_service.scale.run` does the work): an
embedded ZooKeeper (or ``$FRAMEWORK_ZK_HOSTS``, in a fresh chroot), the generated site
(10,000 pages on 32 virtual hosts, robots.txt, 404s), two masters (master-2 stands by) and
four fetchers.  At 40% of the pages the active master is killed with ``kill -9`` (the standby
leads once its session expires, and resumes from the partition records); at 60% ``fetcher-1``
is (its partitions move to the other fetchers and to ``fetcher-5``, started in its place, and
are resumed from their last published checkpoints).  At the end every WARC file is checked
against the site's ground truth, rebuilt from its manifest: every page stored, nothing else
(no page robots.txt forbids), every stored response byte for byte what the site serves.

Exit status 0 when every check passes, 1 otherwise, 2 for a user mistake, 130 on Ctrl-C
(every process the demo started dies with it).  Output in ``out/demo/``: ``warc/`` (one
directory per fetcher), ``logs/`` (one log per process), ``site.json``, ``result.json``.
Options: ``python -m examples.fetch_service.demo --help``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from examples.fetch_service.scale.run import build_parser, run_main

DEFAULTS = {"pages": 10_000, "hosts": 32, "fetchers": 4, "masters": 2, "kill_master_at": 0.4,
            "kill_at": 0.6, "session_timeout": 3.0, "timeout": 600.0,
            "out": Path("out/demo")}


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser("python -m examples.fetch_service.demo", **DEFAULTS), argv)


if __name__ == "__main__":
    sys.exit(main())

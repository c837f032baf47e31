"""What the demo shows while the crawl runs: a rich live view, or plain lines without a TTY.

:class:`CrawlView` is fed from ZooKeeper watches (the fetchers' group nodes, the master's
rendezvous and progress nodes) and keeps just enough history to compute per-fetcher rates.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import attrs
from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

__all__ = ["CrawlView", "FetcherView"]

#: Seconds of history behind a fetcher's rate.
RATE_WINDOW = 3.0


@attrs.define
class FetcherView:
    name: str
    state: str = "starting"
    pages: int = 0
    errors: int = 0
    batches: int = 0
    history: deque[tuple[float, int]] = attrs.field(factory=lambda: deque(maxlen=64))

    def update(self, status: dict[str, Any], now: float) -> None:
        health = status.get("health") or {}
        self.state = str(status.get("state", "?"))
        self.pages = int(health.get("pages", self.pages))
        self.errors = int(health.get("errors", self.errors))
        self.batches = int(health.get("batches", self.batches))
        self.history.append((now, self.pages))

    def rate(self, now: float) -> float:
        """Pages per second over the last :data:`RATE_WINDOW` seconds."""
        recent = [(t, p) for t, p in self.history if now - t <= RATE_WINDOW]
        older = [(t, p) for t, p in self.history if now - t > RATE_WINDOW]
        start = older[-1] if older else (recent[0] if recent else None)
        if start is None or now - start[0] <= 0:
            return 0.0
        return max(self.pages - start[1], 0) / (now - start[0])


@attrs.define
class CrawlView:
    """The demo's picture of the crawl."""

    expected: int
    started: float = attrs.field(factory=time.monotonic)
    leader: str | None = None
    leader_pid: int | None = None
    standbys: int = 0
    progress: dict[str, Any] = attrs.field(factory=dict)
    fetchers: dict[str, FetcherView] = attrs.field(factory=dict)
    events: list[str] = attrs.field(factory=list)
    finished: bool = False

    @property
    def pages(self) -> int:
        return sum(f.pages for f in self.fetchers.values())

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def event(self, text: str) -> str:
        line = f"[{self.elapsed():5.1f}s] {text}"
        self.events.append(line)
        return line

    def update_fetchers(self, members: dict[str, dict[str, Any]]) -> None:
        now = time.monotonic()
        for name, status in members.items():
            self.fetchers.setdefault(name, FetcherView(name)).update(status, now)
        for name, view in self.fetchers.items():
            if name not in members:
                view.state = "gone"

    def render(self) -> RenderableType:
        now = time.monotonic()
        head = Table.grid(padding=(0, 2))
        head.add_column(style="bold")
        head.add_column()
        master = self.leader or "(none: election in progress)"
        if self.leader_pid:
            master += f"  pid {self.leader_pid}"
        head.add_row("elapsed", f"{self.elapsed():.1f}s")
        head.add_row("master", Text(master, style="green" if self.leader else "red"))
        progress = self.progress
        if progress:
            head.add_row("level", f"{progress.get('level')} of max {progress.get('max_depth')}: "
                         f"{progress.get('level_urls')} URLs in "
                         f"{progress.get('level_batches')} batches ({progress.get('state')})")
        done = min(self.pages, self.expected)
        bar = Table.grid(padding=(0, 2))
        bar.add_row(Text("pages", style="bold"),
                    ProgressBar(total=max(self.expected, 1), completed=done, width=40),
                    f"{self.pages}/{self.expected}")
        fetchers = Table(title=None, box=None, padding=(0, 2), header_style="bold")
        for column in ("fetcher", "state", "pages", "pages/s", "batches", "errors"):
            fetchers.add_column(column, justify="left" if column in ("fetcher", "state")
                                else "right")
        for name, view in sorted(self.fetchers.items()):
            fetchers.add_row(name, view.state, str(view.pages), f"{view.rate(now):.1f}",
                             str(view.batches), str(view.errors))
        return Group(head, bar, fetchers)

    def plain(self) -> str:
        now = time.monotonic()
        rates = ", ".join(f"{n} {v.pages} ({v.rate(now):.1f}/s)"
                          for n, v in sorted(self.fetchers.items()))
        level = self.progress.get("level", "-")
        return (f"[{self.elapsed():5.1f}s] pages {self.pages}/{self.expected}  "
                f"master {self.leader or '(electing)'}  level {level}  {rates}")

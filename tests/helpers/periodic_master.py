"""A master with one periodic schedule, in a process of its own (for kill -9 tests).

Usage: ``python periodic_master.py HOSTS CHROOT APP NAME SECONDS CATCH_UP``.

Leads forever; its schedule fires task ``tick`` every SECONDS (catch-up policy CATCH_UP:
latest, all or skip).  Prints ``LEADING`` once elected.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("FRAMEWORK_LOG_LEVEL", "warning")


def main() -> None:
    import trio

    from framework import Session
    from framework.runtime import CatchUp, Master, MasterContext, every

    hosts, chroot, app, name, seconds, catch_up = sys.argv[1:7]

    class Ticking(Master):
        schedules = [every(float(seconds), "tick", {"from": "schedule"}, name="ticks",
                           catch_up=CatchUp(catch_up))]

        async def lead(self, ctx: MasterContext) -> None:
            print("LEADING", flush=True)
            await trio.sleep_forever()

    async def run() -> None:
        async with Session(hosts, chroot=chroot, session_timeout=2.0) as session:
            await Ticking(app, name=name).run(session)

    trio.run(run)


if __name__ == "__main__":
    main()

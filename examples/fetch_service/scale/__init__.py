"""The Fetch Service at crawl scale: ZooKeeper as the control plane only.

The URL space is split by host hash into partitions (:mod:`.urls`); each partition is a
push-mode shard of the runtime, owned by one fetcher at a time under an epoch
(:mod:`.ownership`).  Its frontier, seen-set and politeness state live with the owner in
sqlite (:mod:`.store`), checkpointed to a shared directory; found links travel to the owning
partition as files in per-partition inboxes (:mod:`.inbox`).  ZooKeeper holds one record per
partition, the job, the configuration, the report and the runtime's own nodes
(:mod:`.layout`): their number and write rate do not grow with the number of pages.

Guarantees of a crawl: every URL reachable from the seeds on the allowed hosts is fetched
and stored at least once (again only after a failover: the work since the last checkpoint
is redone), provided ``max_depth`` does not cut it (the crawl is not breadth-first: a page
may first be reached by a longer path); no page robots.txt forbids is fetched (with
``obey_robots``); requests to one host never overlap, also across a move between live
fetchers (the hand-over of :mod:`.ownership`).  Design, costs and measurements:
``docs/architecture.md`` ("Fetch Service at scale") and ``docs/fetch_service_scale.md``.
"""

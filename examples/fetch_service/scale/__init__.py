"""The Fetch Service at crawl scale: ZooKeeper as the control plane only (issue #17).

The URL space is split by host hash into partitions; each partition is a push-mode shard of
the runtime, owned by one fetcher at a time under an epoch.  Its frontier, seen-set and
politeness state live with the owner in sqlite, checkpointed to a shared directory; found
links travel to the owning partition as files in per-partition inboxes.  ZooKeeper holds one
record per partition, the job, the configuration and the runtime's own nodes: its size and
write rate do not grow with the number of pages.  See ``docs/fetch_service_scale.md``.
"""

"""Katta-like distributed search on the framework (issue #11).

Index build as a pull-mode job, tantivy shards in a shared shard store, replicated placement
by the master, search nodes answering msgpack frames over persistent TCP connections, a
scatter-gather client routing by the deployment records the nodes write.  See
``docs/katta_like.md`` and docs/architecture.md, "Katta query path".
"""

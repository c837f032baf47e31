"""The Fetch Service's master and worker classes, for ``framework run``.

Level by level (the seen-set and the plans in ZooKeeper; application ``fetch-service``)::

    python -m framework run examples.fetch_service.app:CrawlMaster --zk HOSTS   # 2 or more
    python -m framework run examples.fetch_service.app:FetchWorker --zk HOSTS   # any number

Partitioned, at crawl scale (ZooKeeper as the control plane only; ``fetch-scale``)::

    python -m framework run examples.fetch_service.app:PartitionMaster --zk HOSTS
    python -m framework run examples.fetch_service.app:PartitionFetcher --zk HOSTS

Start a job with ``python -m examples.fetch_service.ctl start`` (level by level) or run a
whole partitioned crawl with ``python -m examples.fetch_service.scale.run``.
"""

from examples.fetch_service.master import CrawlMaster
from examples.fetch_service.scale.master import PartitionMaster
from examples.fetch_service.scale.worker import PartitionFetcher
from examples.fetch_service.state import APP_NAME
from examples.fetch_service.worker import FetchWorker

__all__ = ["APP_NAME", "CrawlMaster", "FetchWorker", "PartitionFetcher", "PartitionMaster"]

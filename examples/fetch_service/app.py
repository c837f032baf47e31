"""The Fetch Service's master and fetcher classes, for ``framework run``::

    python -m framework run examples.fetch_service.app:PartitionMaster --zk HOSTS  # 1 or more
    python -m framework run examples.fetch_service.app:PartitionFetcher --zk HOSTS # any number

A job is started with :func:`examples.fetch_service.scale.layout.start_job`;
``python -m examples.fetch_service.scale.run`` runs a whole crawl (``make demo``).
"""

from examples.fetch_service.scale.layout import APP_NAME
from examples.fetch_service.scale.master import PartitionMaster
from examples.fetch_service.scale.worker import PartitionFetcher

__all__ = ["APP_NAME", "PartitionFetcher", "PartitionMaster"]

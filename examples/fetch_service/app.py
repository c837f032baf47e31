"""The Fetch Service's master and worker classes, for ``framework run``::

    python -m framework run examples.fetch_service.app:CrawlMaster --zk HOSTS   # 2 or more
    python -m framework run examples.fetch_service.app:FetchWorker --zk HOSTS   # any number

Start a job with ``python -m examples.fetch_service.ctl start``; see the example's README.
"""

from examples.fetch_service.master import CrawlMaster
from examples.fetch_service.state import APP_NAME
from examples.fetch_service.worker import FetchWorker

__all__ = ["APP_NAME", "CrawlMaster", "FetchWorker"]

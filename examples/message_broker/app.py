"""The message broker's server and controller classes, for ``framework run``::

    python -m framework run examples.message_broker.app:BrokerController --zk HOSTS  # 2+
    python -m framework run examples.message_broker.app:BrokerServer --zk HOSTS      # any

Create topics with ``python -m examples.message_broker.ctl create``; see
docs/message_broker.md.
"""

from examples.message_broker.controller import BrokerController
from examples.message_broker.layout import APP_NAME
from examples.message_broker.server import BrokerServer

__all__ = ["APP_NAME", "BrokerController", "BrokerServer"]

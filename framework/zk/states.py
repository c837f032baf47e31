"""Session state as plain data that trio code can wait on."""

from __future__ import annotations

import enum

import attrs


class SessionState(enum.Enum):
    """The simplified state of a ZooKeeper session, as seen by this process.

    * ``CONNECTED`` - requests flow; ephemeral nodes and watches of the session are in place.
    * ``SUSPENDED`` - the connection dropped; the session may still be alive on the server (and
      so may our ephemeral nodes), or it may already have expired: we cannot know until we
      reconnect.  Nothing that depends on the session should be trusted.
    * ``LOST`` - the session expired or was closed: its ephemeral nodes are gone.  The session keeps
      trying and a *new* session (another ``session_id``) may follow as ``CONNECTED``.
    """

    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"


@attrs.frozen
class StateChange:
    """One transition, numbered by ``generation`` (strictly increasing within a Session)."""

    state: SessionState
    session_id: int | None
    generation: int

"""Sequential creates that survive a lost reply.

A create whose reply is lost (``ConnectionLossError``) may or may not have happened.  For a
sequential node a blind retry could leave a second, orphaned node that blocks a lock or an
election forever.  So every protected node carries a GUID in its name; after a lost reply we
list the parent and adopt the node that carries our GUID, creating again only if none does.

Names look like ``{prefix}{guid}-0000000042``: the sequence number is always the last ten
digits, so :func:`sequence_of` sorts nodes of any prefix.
"""

from __future__ import annotations

import uuid

from framework import errors
from framework.zk.scopes import cleanup_scope
from framework.zk.session import Session


def new_guid() -> str:
    return uuid.uuid4().hex


def sequence_of(name: str) -> int:
    """The server-assigned sequence number at the end of a sequential node's name."""
    try:
        return int(name[-10:])
    except ValueError:
        raise errors.ConfigurationError(f"not a sequential node name: {name!r}") from None


def sort_sequential(names: list[str] | tuple[str, ...]) -> list[str]:
    """Sort sequential node names by sequence number (ignoring their prefixes)."""
    return sorted(names, key=sequence_of)


def find_guid(names: list[str] | tuple[str, ...], guid: str) -> str | None:
    """The name carrying ``guid`` among ``names`` (there is at most one), or ``None``."""
    for name in names:
        if guid in name:
            return name
    return None


async def create_protected(
    session: Session,
    parent: str,
    prefix: str,
    data: bytes = b"",
    *,
    guid: str,
    ephemeral: bool = True,
    sequence: bool = True,
    makepath: bool = True,
) -> str:
    """Create ``parent/{prefix}{guid}-NNNNNNNNNN`` exactly once; return its full path.

    Recovers from lost replies as the module describes.  If the session expires before the
    create is confirmed, an ephemeral node cannot be ours any more, so
    :class:`SessionExpiredError` is raised; a persistent one is searched for as usual.
    """
    name = f"{prefix}{guid}-" if sequence else f"{prefix}{guid}"
    while True:
        try:
            return await session.create(
                f"{parent}/{name}", data, ephemeral=ephemeral, sequence=sequence,
                makepath=makepath,
            )
        except (errors.ConnectionLossError, errors.SessionExpiredError) as exc:
            if ephemeral and isinstance(exc, errors.SessionExpiredError):
                raise
            found = await _search(session, parent, guid, ephemeral)
            if found is not None:
                return f"{parent}/{found}"


async def _search(session: Session, parent: str, guid: str, ephemeral: bool) -> str | None:
    session_id = await session.wait_connected()
    try:
        # The lost create may be newer than anything this client saw, and a lagging follower
        # we reconnected to may not have it yet: catch up with the leader before looking.
        await session.sync(parent)
        names = await session.children(parent)
    except errors.NoNodeError:
        return None
    found = find_guid(names, guid)
    if found is not None and ephemeral:
        stat = await session.exists(f"{parent}/{found}")
        if stat is None or stat.ephemeralOwner != session_id:
            return None
    return found


async def delete_guid_nodes(session: Session, parent: str, guid: str) -> None:
    """Delete every child of ``parent`` carrying ``guid``; safe to call from ``finally``.

    Shielded from cancellation and bounded in time, so a cancelled acquire never leaks its
    contender node while the session lives (an expired session removes it anyway); past the
    bound the node is left to :meth:`Session.delete_guid_later`.
    """
    with cleanup_scope(session) as scope:
        await _delete_guid_nodes(session, parent, guid)
    if scope.cancelled_caught:
        session.delete_guid_later(parent, guid)


async def _delete_guid_nodes(session: Session, parent: str, guid: str) -> None:
    while True:
        try:
            names = await session.children(parent)
            for name in names:
                if guid in name:
                    await session.delete(f"{parent}/{name}", missing_ok=True)
            return
        except errors.NoNodeError:
            return
        except errors.ConnectionLossError:
            continue
        except (errors.SessionExpiredError, errors.NotConnectedError):
            return

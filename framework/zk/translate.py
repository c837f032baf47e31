"""kazoo's exceptions as the framework's typed errors, with what was refused and why."""

from __future__ import annotations

from kazoo import exceptions as kz

from framework import errors

_KAZOO_TO_FRAMEWORK: dict[type[BaseException], type[errors.ZooKeeperError]] = {
    kz.NoNodeError: errors.NoNodeError,
    kz.NodeExistsError: errors.NodeExistsError,
    kz.BadVersionError: errors.BadVersionError,
    kz.NotEmptyError: errors.NotEmptyError,
    kz.NoChildrenForEphemeralsError: errors.NoChildrenForEphemeralsError,
    kz.ConnectionLoss: errors.ConnectionLossError,
    kz.ConnectionClosedError: errors.NotConnectedError,
    kz.SessionExpiredError: errors.SessionExpiredError,
    kz.RolledBackError: errors.RolledBackError,
}


#: What a refused request was doing, by kazoo record (or transaction operation) name.
_ACTIONS = {
    "GetData": "read", "SetData": "write", "Create": "create", "Create2": "create",
    "Delete": "delete", "GetChildren": "list", "GetChildren2": "list", "Exists": "check",
    "GetACL": "read the ACL of", "SetACL": "change the ACL of", "Sync": "sync",
    "create": "create", "set_data": "write", "delete": "delete", "check": "check",
}

#: Why the server refused, for errors whose kazoo message is empty.
_REASONS: dict[type[BaseException], str] = {
    kz.NoAuthError: "the node's ACL does not give this client that permission (NoAuth)",
    kz.BadArgumentsError: "the server rejected the request's arguments (BadArguments)",
    kz.InvalidACLError: "the ACL is not valid (InvalidACL)",
    kz.AuthFailedError: "authentication failed (AuthFailed)",
}


def describe(action: str, path: str) -> str:
    """``"write '/a'"``: what a request did, for error messages."""
    return f"{_ACTIONS.get(action, action)} {path!r}"


def translate(exc: BaseException, context: str | None = None) -> BaseException:
    """Map a kazoo exception to the framework's typed error (others pass through).

    ``context`` (see :func:`describe`) names the refused operation and its path in the
    message of errors that do not say it themselves (NoAuth, BadArguments, ...).
    """
    for kazoo_type, ours in _KAZOO_TO_FRAMEWORK.items():
        if isinstance(exc, kazoo_type):
            new = ours(str(exc) or kazoo_type.__name__)
            new.__cause__ = exc
            return new
    if isinstance(exc, kz.ZookeeperError):
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else next(
            (text for kind, text in _REASONS.items() if isinstance(exc, kind)),
            type(exc).__name__,
        )
        if context is not None:
            reason = f"{context} refused: {reason}"
            if " '/zookeeper" in context:
                reason += (
                    "; /zookeeper belongs to the ZooKeeper server (its quotas and its "
                    "configuration): only the server's super user may change it"
                )
        kind = errors.NoAuthError if isinstance(exc, kz.NoAuthError) else errors.ZooKeeperError
        new = kind(reason)
        new.__cause__ = exc
        return new
    return exc

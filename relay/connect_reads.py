"""A connect's database read: the token verified, the user, their channels and each app's `load`.

The connects of one event loop that wait for the database together share one worker-thread hop
(relay.batching), and one query per table for the batch (relay.queries).
"""

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from channels.db import database_sync_to_async

from relay import registry
from relay.batching import GroupCommit
from relay.exceptions import InvalidToken
from relay.logging import Event, log_event
from relay.loops import PerLoop
from relay.models import Environment, User
from relay.queries import channel_ids_of_user, channel_ids_of_users, users_by_external_id
from relay.tokens import authenticate

logger = logging.getLogger(__name__)


def log_hook_failure(hook: str, error: Exception) -> None:
    """Log an extension's failure by name and exception type only (no traceback, nothing secret)."""
    log_event(logger, Event.CONNECTION_HOOK_FAILED, logging.ERROR, hook=hook, error=type(error).__name__)


@dataclass
class ConnectRead:
    """What a connect reads from the database: the user, their channels, and each extension's `load`."""

    user: User
    channel_ids: set[str]
    loaded: dict[registry.Extension, Any] = field(default_factory=dict)


def _read_connects(reads: list[tuple[str | None, list[registry.Extension]]]) -> list[ConnectRead | Exception]:
    """Each (token, extensions)'s read, or the exception that refused or failed it.

    The batch shares its reads: one query for the users of each environment, one for all their
    channels, one `load` per extension. A token that does not verify, or names no user, is its
    own InvalidToken; a database error fails every connect whose token verified.
    """
    outcomes: list[ConnectRead | Exception] = []
    subjects: dict[uuid.UUID, tuple[Environment, dict[int, str]]] = {}
    for index, (token, _) in enumerate(reads):
        try:
            environment, subject = authenticate(token)
        except Exception as error:
            outcomes.append(error)
        else:
            outcomes.append(InvalidToken("unknown user"))  # unless the read below finds the user
            subjects.setdefault(environment.id, (environment, {}))[1][index] = subject
    found: dict[int, ConnectRead] = {}
    try:
        for environment_id, (environment, wanted) in subjects.items():
            users = users_by_external_id(environment_id, set(wanted.values()))
            for index, subject in wanted.items():
                if (user := users.get(subject)) is not None:
                    user.environment = environment  # the cached one, as select_related would
                    found[index] = ConnectRead(user=user, channel_ids=set())
        channels = channel_ids_of_users([read.user.pk for read in found.values()])
    except Exception as error:
        for _, wanted in subjects.values():
            for index in wanted:
                outcomes[index] = error
        return outcomes
    for index, read in found.items():
        read.channel_ids = channels.get(read.user.pk, set())
        outcomes[index] = read
    for ext in dict.fromkeys(ext for _, extensions in reads for ext in extensions):
        if type(ext).load is not registry.Extension.load:
            _load(ext, [read for index, read in found.items() if ext in reads[index][1]])
    return outcomes


def _load(ext: registry.Extension, connects: list[ConnectRead]) -> None:
    if not connects:
        return
    try:
        loaded = list(ext.load([(read.user, frozenset(read.channel_ids)) for read in connects]))
        if len(loaded) != len(connects):
            raise ValueError(f"{len(loaded)} results for {len(connects)} connects")
    except Exception as error:
        # The extension does without (as a failed hook would); the connections still open.
        log_hook_failure(f"{type(ext).__name__}.load", error)
        return
    for read, value in zip(connects, loaded, strict=True):
        read.loaded[ext] = value


_read_in_worker = database_sync_to_async(_read_connects)

# The connect path's database hop, shared by the connects of one event loop that wait for it
# (relay.batching). A connect reads its token, user, channels and every extension's `load` in ONE
# worker-thread hop, because the hop itself (the handoff to the thread and back, Django's
# connection bookkeeping on both sides, the GIL passed between the threads) costs more than the
# reads in it.
_connect_reads = PerLoop(lambda: GroupCommit(_read_in_worker))


async def read_connect(token: str | None, extensions: list[registry.Extension]) -> ConnectRead:
    """Authenticate a connect and read what it needs, in the event loop's shared database hop."""
    return await _connect_reads().submit((token, extensions))


@database_sync_to_async
def read_channel_ids(user: User) -> set[str]:
    """Return the ids of the channels `user` belongs to."""
    return channel_ids_of_user(user.pk)

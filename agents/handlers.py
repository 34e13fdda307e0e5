"""The `register`, `heartbeat` and `deregister` frame families, owned by this app alone.

Each handler is thin: the payload was already validated strictly against its schema in
`relay.frames` (a bad one is answered `invalid_payload` before it gets here), so it calls
one action and answers. What a connection registered is mirrored in `conn.state["agents"]`
(`{instance: capability}`), so a live connection knows it without a query.
"""

import logging
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any

from channels.db import database_sync_to_async
from django.db import DatabaseError

from agents import actions
from agents.exceptions import InstanceOwned, RegistrationsCapped
from relay import registry
from relay.exceptions import FrameError
from relay.frames import Deregister, DeregisterAck, Heartbeat, Register, RegisterAck
from relay.logging import Event, log_event
from relay.registry import Connection

logger = logging.getLogger(__name__)

STATE_KEY = "agents"


registry.sends("register.ack", RegisterAck)
registry.sends("deregister.ack", DeregisterAck)


def registered_instances(conn: Connection) -> dict[str, dict]:
    """Return what this connection registered: `{instance: capability fields given}`."""
    return conn.state.setdefault(STATE_KEY, {})


def database_guarded(handler: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Answer `error unavailable` when the database fails, instead of letting the socket die with it."""

    @wraps(handler)
    async def guarded(conn: Connection, payload: Any) -> None:
        try:
            await handler(conn, payload)
        except DatabaseError as error:
            # A busy or unreachable database is the registry's fault alone: the connection
            # keeps carrying presence and messages, and the worker may simply retry.
            log_event(logger, Event.AGENT_FAILED, logging.ERROR, op=handler.__name__, error=type(error).__name__)
            raise FrameError("unavailable", "the agent registry is unavailable, try again") from None

    return guarded


@registry.frame("register", Register, error_code="invalid_payload")
@database_guarded
async def register(conn: Connection, payload: Register) -> None:
    """Register (or re-register) an instance for the connection's identity; `register.ack`."""
    try:
        row, _ = await database_sync_to_async(actions.do_register)(
            conn.user, payload.instance, payload.capability, conn.connection_id
        )
    except InstanceOwned as owned:
        raise FrameError("instance_owned", str(owned)) from None
    except RegistrationsCapped as capped:
        raise FrameError("limit_reached", str(capped)) from None
    registered_instances(conn)[payload.instance] = payload.capability.model_dump(exclude_none=True)
    ack = RegisterAck(instance=row.instance, registered_at=row.registered_at.isoformat())
    await conn.send_frame("register.ack", ack)


@registry.frame("heartbeat", Heartbeat, error_code="invalid_payload")
@database_guarded
async def heartbeat(conn: Connection, payload: Heartbeat) -> None:
    """Refresh the caller's own instance; no reply, and silence for an unknown or foreign one."""
    await database_sync_to_async(actions.do_heartbeat)(conn.user, payload.instance)


@registry.frame("deregister", Deregister, error_code="invalid_payload")
@database_guarded
async def deregister(conn: Connection, payload: Deregister) -> None:
    """Remove the caller's own instance; `deregister.ack`, or silence for an unknown or foreign one."""
    removed = await database_sync_to_async(actions.do_deregister)(conn.user, payload.instance)
    registered_instances(conn).pop(payload.instance, None)
    if removed:
        await conn.send_frame("deregister.ack", DeregisterAck(instance=payload.instance))

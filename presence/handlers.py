"""Rich presence on the WebSocket: `presence.set`, `presence.activity`, `presence.query`, devices.

The frames' rules are docs/contract.md, Rich presence; the state and its announcements are
presence/status.py's. `RichPresence` runs before `PresenceExtension` (presence/extension.py):
the election must know whether the user is invisible before it publishes their `online`.
"""

import asyncio
import logging
import time

from channels.db import database_sync_to_async
from django.conf import settings

from presence import actions, status
from presence.models import UserStatus
from presence.status import DEFAULT_DEVICE, DEVICE_KEY, DEVICES, Device, Status
from relay import registry
from relay.exceptions import FrameError
from relay.frames import (
    PresenceActivity,
    PresenceQuery,
    PresenceResult,
    PresenceSet,
    PresenceStatus,
    QueriedUser,
    format_instant,
)
from relay.models import Environment, Membership, User
from relay.registry import Connection

logger = logging.getLogger("presence")

registry.sends("presence.status", PresenceStatus)
registry.sends("presence.result", PresenceResult)

RATE_MESSAGE = "too many presence updates; slow down"
# Set when the socket URL named a device kind that does not exist (told after the snapshot).
BAD_DEVICE_KEY = "presence.bad_device"
# The user's stored status as the connect's database read found it, until the snapshot.
OWN_STATUS_KEY = "presence.own_status"


class RichPresence(registry.Extension):
    """Reads the user's status for the election and the snapshot, records the device."""

    # Before PresenceExtension (10): its election reads INVISIBLE_KEY.
    order = 5

    def load(self, connects: list[tuple[User, frozenset[str]]]) -> list[Status]:
        """Each connecting user's stored status, in one query: the election reads invisibility,
        and the snapshot the user's own status (a first connect would otherwise read it alone)."""
        rows = UserStatus.objects.filter(user_id__in=[user.pk for user, _ in connects])
        stored = {row.user_id: Status.of(row) for row in rows}
        return [stored.get(user.pk, Status()) for user, _ in connects]

    async def admit(self, conn: Connection) -> None:
        raw = conn.query.get("device", [None])[0]
        kind = raw if raw in DEVICES else DEFAULT_DEVICE
        if raw is not None and raw not in DEVICES:
            conn.state[BAD_DEVICE_KEY] = True
        own: Status | None = conn.loaded.get(self)
        if own is None:
            invisible = await actions.read_invisible(conn.environment_id, conn.user_id)
        else:
            invisible = own.invisible
            conn.state[OWN_STATUS_KEY] = own
            conn.state[actions.AHEAD_KEY] = [status.fill(conn.environment_id, conn.user_id, own)]
        conn.state[actions.INVISIBLE_KEY] = invisible
        conn.state[DEVICE_KEY] = Device(kind=kind, idle=False, connected_ms=_now_ms())

    async def opened(self, conn: Connection) -> None:
        devices = status.devices()
        # The users' own statuses, with `invisible`, joined by the process once. Once the socket is
        # open: with Redis away a subscription waits for its confirmation, and one more wait before
        # the accept would pass Daphne's handshake timeout.
        await devices.join()
        # After the election, not before: nothing of rich presence may delay (or reorder) it.
        devices.add(conn)
        changed = await status.devices_op(
            conn.environment_id, conn.user_id, "put", status.live_ttl(), *status.entry(conn)
        )
        if changed is not None and changed[0]:
            # A connection starts active: an idle user is active again.
            await status.announce_idle(conn.environment_id, conn.user_id, changed[1])

    async def closed(self, conn: Connection) -> None:
        # Only an opened connection wrote its entry.
        opened = status.devices().discard(conn)
        status.RATE.forget(conn.connection_id)
        service = actions.service()
        # A shutdown closes the store's client under the closing consumers: their entries are
        # left to expire with the instance's keys (presence/shutdown.py).
        if not opened or service.closed:
            return
        grace = settings.RELAY_PRESENCE_GRACE_MS
        await status.devices_op(conn.environment_id, conn.user_id, "close", grace, conn.connection_id)
        # The entry stops counting after the grace: whether that flips idle is decided then.
        delay = (grace + settings.RELAY_PRESENCE_MARGIN_MS) / 1000
        service.spawn(_sweep_later(service, conn.environment_id, conn.user_id, delay))


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _sweep_later(service: actions.PresenceService, environment_id: str, user_id: str, delay: float) -> None:
    await service.clock.sleep(delay)
    if service.closed:
        return
    changed = await status.devices_op(environment_id, user_id, "sweep", 0)
    if changed is not None and changed[0]:
        await status.announce_idle(environment_id, user_id, changed[1])


async def snapshot_status(conn: Connection, online: list[str]) -> tuple[list[str], dict]:
    """The snapshot's `online` without invisible users (but the user) and those said `offline`
    since it was read (`PresenceStore.said_offline`, in the same round trip), and the status of each."""
    own = conn.state.pop(OWN_STATUS_KEY, None)
    known = {conn.user_id: own} if own is not None else {}
    others = [user_id for user_id in online if user_id != conn.user_id]
    cached, left = await asyncio.gather(
        status.cached_statuses(conn.environment_id, online, known),
        actions.service().store.said_offline(conn.environment_id, others),
    )
    visible = [
        user_id
        for user_id in online
        if user_id == conn.user_id or (user_id not in left and not cached[user_id][0].invisible)
    ]
    return visible, {user_id: cached[user_id][0].out(cached[user_id][1]) for user_id in visible}


async def after_snapshot(conn: Connection, statuses: dict) -> None:
    """What follows the snapshot: a device kind that does not exist is told right after it, and an
    invisible user's connection hears that it is (its own status, with `invisible`)."""
    if conn.state.pop(BAD_DEVICE_KEY, False):
        await conn.send_error("invalid_request", f"device must be one of {', '.join(DEVICES)}; counted as web")
    own = statuses.get(conn.user_id)
    # Popped: an idle connection need not keep what only its opening needed.
    if conn.state.pop(actions.INVISIBLE_KEY, False) and own is not None:
        await conn.send_frame("presence.status", PresenceStatus(user=conn.user_id, **own, invisible=True))


# ── frames ───────────────────────────────────────────────────────────────────
@registry.frame("presence.set", PresenceSet)
async def presence_set(conn: Connection, payload: PresenceSet) -> None:
    """Change the user's status; watchers and all the user's connections are told."""
    status.RATE.check("presence.set", RATE_MESSAGE, conn.connection_id)
    try:
        await status.set_status(conn.environment_id, conn.user, payload, conn.channel_ids)
    except status.Forbidden:
        raise FrameError("forbidden", "this environment does not allow invisibility", "presence.set") from None


@registry.frame("presence.activity", PresenceActivity)
async def presence_activity(conn: Connection, payload: PresenceActivity) -> None:
    """This connection is idle or active again; the user is idle while all their connections are."""
    status.RATE.check("presence.activity", RATE_MESSAGE, conn.connection_id)
    device: Device | None = conn.state.get(DEVICE_KEY)
    if device is None or device.idle == payload.idle:
        return
    device.idle = payload.idle
    changed = await status.devices_op(conn.environment_id, conn.user_id, "put", status.live_ttl(), *status.entry(conn))
    if changed is not None and changed[0]:
        await status.announce_idle(conn.environment_id, conn.user_id, changed[1])


def queryable(environment_id: str, asker: int, user_ids: list[str]) -> tuple[dict[str, Status], bool]:
    """The stored status of each of `user_ids` sharing a channel with `asker`, and share_last_seen."""
    shared = set(
        Membership.objects.filter(
            user__environment_id=environment_id,
            user__external_id__in=user_ids,
            channel__environment_id=environment_id,
            channel__memberships__user_id=asker,
        ).values_list("user__external_id", flat=True)
    )
    stored = status.read_statuses(environment_id, sorted(shared))
    share = Environment.objects.filter(pk=environment_id).values_list("share_last_seen", flat=True).first()
    return {user_id: stored.get(user_id, Status()) for user_id in shared}, bool(share)


read_queryable = database_sync_to_async(queryable, thread_sensitive=False)


@registry.frame("presence.query", PresenceQuery)
async def presence_query(conn: Connection, payload: PresenceQuery) -> None:
    """`presence.result` for the asked users who share a channel with the asker; the others are absent."""
    wanted = list(dict.fromkeys(payload.users))
    known, share_last_seen = await read_queryable(conn.environment_id, conn.user.pk, wanted)
    ids = sorted(known)
    online = set(await actions.service().store.online(conn.environment_id, ids) or ())
    cached = await status.cached_statuses(conn.environment_id, ids)
    users: dict[str, QueriedUser] = {}
    for user_id in ids:
        stored = known[user_id]
        last_seen = format_instant(stored.last_seen_at) if share_last_seen else None
        if stored.invisible and user_id != conn.user_id:
            users[user_id] = QueriedUser(state="offline", last_seen_at=last_seen, **Status().out(idle=False))
            continue
        is_online = user_id in online
        idle = cached[user_id][1] if is_online else False
        users[user_id] = QueriedUser(
            state="online" if is_online else "offline", last_seen_at=last_seen, **stored.effective().out(idle=idle)
        )
    await conn.send_frame("presence.result", PresenceResult(users=users))

"""The presence key layout and the Lua scripts that change it: what Redis runs, in one place.

Keys, all scoped by environment so the same user id in two tenants is two people, and laid out
for Redis Cluster (presence/keys.py): a user's keys carry their bucket's tag `{b<n>}`, the keys
spanning users exist once per bucket, and every script declares every key it touches in KEYS, all
of one bucket (or of one channel), so each script runs on one slot:

- `presence:{b<n>}:{env}:{user}`          the presence key: exists while the user is online (the election)
- `presence:offline:{b<n>}:{env}:{user}`  the offline marker: elects one publisher of `offline`
- `presence:conns:{b<n>}:{env}:{user}`    sorted set of live connection ids (score = expiry, Redis ms)
- `presence:deadlines:{b<n>}`             sorted set of the bucket's `{env}:{user}` (score = when a
                                          silent holder is presumed dead: last refresh + TTL + grace),
                                          reaped bucket by bucket by every instance
- `presence:channels:{b<n>}:{env}:{user}` hash beside the deadline: `c` the user's channel ids (comma-
                                          separated) as their holders last wrote them, `e` the epoch
                                          then, `h` "1" while watchers were last told `offline` by
                                          invisibility; what the reaper's `offline` needs, with no
                                          database read
- `presence:epoch:{b<n>}`                 a random id (and `@` when it began) written by the first script
                                          that finds it missing:
                                          a different or missing epoch means the bucket's Redis (a
                                          cluster's master of its slot) lost its data meanwhile

The refresh and the reaper, which take many users, run one script per bucket (pipelined).

Above each script, its "Equivalent Python": what the script does, written as if Redis were a
dict, for a reader who does not read Lua. The script is what runs; the Python is never executed.
A script marked "delicate, performance-sensitive" runs on every connect, or holds Redis for a
whole instance or batch at a time: measure (`make bench`, scripts/measure_presence_redis.py)
before adding a command to it. The async client that calls them is presence/store.py.
"""

import uuid

from presence.keys import bucket_tag, channel_tag, user_bucket, user_tag


def member(environment_id: str, user_id: str) -> str:
    """The `{env}:{user}` name of one tenant's user, the suffix of all their keys."""
    return f"{environment_id}:{user_id}"


def split_member(name: str) -> tuple[str, str]:
    """Return (environment id, user id) of a `{env}:{user}` member."""
    environment_id, _, user_id = name.partition(":")
    return environment_id, user_id


def member_bucket(name: str) -> int:
    """The bucket of a `{env}:{user}` member (presence/keys.py)."""
    return user_bucket(*split_member(name))


def _user_key(kind: str, environment_id: str, user_id: str) -> str:
    return f"presence:{kind}{user_tag(environment_id, user_id)}:{member(environment_id, user_id)}"


def presence_key(environment_id: str, user_id: str) -> str:
    """The key whose existence means "online"."""
    return _user_key("", environment_id, user_id)


def marker_key(environment_id: str, user_id: str) -> str:
    """The marker whose `SET NX` elects the one publisher of `offline`."""
    return _user_key("offline:", environment_id, user_id)


def connections_key(environment_id: str, user_id: str) -> str:
    """The sorted set of the user's live connections on every instance."""
    return _user_key("conns:", environment_id, user_id)


def channels_key(environment_id: str, user_id: str) -> str:
    """The hash beside the deadline: the user's channel ids (`c`) and the epoch they were written in (`e`)."""
    return _user_key("channels:", environment_id, user_id)


def deadlines_key(bucket: int) -> str:
    """The sorted set of one bucket's deadlines."""
    return f"presence:deadlines:{bucket_tag(bucket)}"


def epoch_key(bucket: int) -> str:
    """The epoch of one bucket's data."""
    return f"presence:epoch:{bucket_tag(bucket)}"


def user_deadlines_key(environment_id: str, user_id: str) -> str:
    """The deadline set of the user's bucket."""
    return deadlines_key(user_bucket(environment_id, user_id))


def user_epoch_key(environment_id: str, user_id: str) -> str:
    """The epoch of the user's bucket."""
    return epoch_key(user_bucket(environment_id, user_id))


def channel_online_key(channel_id: str) -> str:
    """The sorted set of the channel's online members (user ids; score = until when, Redis ms).

    Kept by CHANNEL_SEEN, a script of this channel alone (its hash tag), so who is online in a
    channel is one read instead of one per member.
    """
    return f"presence:online:{channel_tag(channel_id)}"


def fresh_epoch() -> str:
    """A new epoch id, written by the script that finds none."""
    return uuid.uuid4().hex


# ── fragments ────────────────────────────────────────────────────────────────

# Redis time in ms: every instance measures deadlines on the one clock they share.
#
# Equivalent Python:
#
#     now = redis.time_ms()
_NOW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

# The epoch of the data Redis holds: written (from the caller's fresh id) when missing, so the
# first script to find Redis emptied starts a new one. `epoch_key` and `fresh` are Lua expressions.
# The id ends with `@` and the time it was written (Redis ms): ADMIT answers the epoch's age, by
# which a snapshot read before the live holders re-elected their users is known (and repaired).
#
# The epoch's TTL: every REFRESH renews it (presence/store.py's `Timings.epoch_ttl`, shorter than
# any deadline is long), and ADMIT gives one to an epoch that has none (TTL + grace, as long as
# the deadline it writes: a connection closed before any refresh has its grace check decided
# within that) before it writes a deadline, so no deadline stands in Redis beside an epoch
# without a TTL. It outlives no live instance, and survives no old dump: an RDB or AOF
# restored from before the TTL brings back stale keys and deadlines but no epoch; the first
# script starts a new one, and the reaper and grace checks treat the old data as lost (they
# wait a refresh for the live holders) instead of deciding `offline` for connected users.
#
# Equivalent Python:
#
#     epoch = redis.setdefault(epoch_key, f"{fresh}@{now}")
_EPOCH = """
local epoch = redis.call('GET', {epoch_key})
if not epoch then
  epoch = {fresh} .. '@' .. string.format('%d', now)
  redis.call('SET', {epoch_key}, epoch)
end
"""


# ── a connection: admitted, released ────────────────────────────────────────

# This script is delicate and performance-sensitive: it runs on every connect.
#
# KEYS: conns, key, marker, deadlines, channels, epoch (the deadlines and the epoch of the user's
# bucket). ARGV: connection id, ttl, grace, max, member, environment id, fresh epoch, the user's
# channel ids (comma-separated), n, then n (channel, payload) pairs to PUBLISH if this connection
# wins, then "1" when the user is invisible (their `online` is for their own connections only)
# else "0". The limit, the election and the winner's `online` in one round trip (the snapshot is read
# from the channels' online sets beside it). Returns {admitted, won, epoch, the epoch's age (ms),
# heard}; won is 0 (the user was online already), 1 (this connection publishes `online`) or 2 (the
# key was gone but the user's last `online` was never retracted: nothing to publish). heard, when
# won is 2: "=" and the channel ids kept beside the deadline before this connection's (those whose
# members that `online` could reach), "" when none were kept. Webhooks: with a 7th key (the
# user's bucket stream, webhooks/stream.py), the winner's `user.online` is XADDed there too.
#
# Equivalent Python:
#
#     if not redis[epoch_key].has_expiry():
#         redis[epoch_key].expire(ttl + grace)             # until the next refresh renews it
#     conns = {c: expiry for c, expiry in conns.items() if expiry > now}
#     if len(conns) >= max:
#         return [0, 0]                                    # refused: 4429
#     conns[connection_id] = now + ttl                     # the set itself expires in ttl
#     heard = ""
#     if key not in redis:                                 # this connection elects the user
#         redis[key] = expiring(ttl)
#         if marker not in redis and member in deadlines:  # an `online` never retracted
#             won = 2
#             if "c" in channels_hash:
#                 heard = "=" + channels_hash["c"]
#         else:
#             won = 1
#             del redis[marker]
#             for channel, payload in publish:
#                 redis.publish(channel, payload)
#             channels_hash["h"] = hidden                  # what the reaper may tell watchers
#             if stream:                                   # webhooks: the event, with the decision
#                 redis.xadd(stream, t="user.online", e=env, u=user, c=channel_ids)
#     else:
#         won = 0
#         redis[key].expire(ttl)                           # undo a close's re-pin to the grace
#     deadlines[member] = now + ttl + grace
#     channels_hash.update(c=channel_ids, e=epoch)
#     age = now - int(epoch.rpartition("@")[2] or 0)
#     return [1, won, epoch, age, heard]
ADMIT = (
    _NOW
    + _EPOCH.format(epoch_key="KEYS[6]", fresh="ARGV[7]")
    + """
local ttl = tonumber(ARGV[2])
-- The epoch's TTL, from the first deadline on (begin)
if redis.call('PTTL', KEYS[6]) == -1 then
  redis.call('PEXPIRE', KEYS[6], ttl + tonumber(ARGV[3]))
end
-- (end)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
  return {0, 0}
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
local won = 0
local heard = ''
if redis.call('SET', KEYS[2], '1', 'PX', ttl, 'NX') then
  if redis.call('EXISTS', KEYS[3]) == 0 and redis.call('ZSCORE', KEYS[4], ARGV[5]) then
    -- The key is gone, yet nobody said the user left and their deadline stands: the instance
    -- that held them died (or a close's re-pin came too late), and the `online` watchers last
    -- heard was never retracted. A second one would say nothing new; the deadline is taken
    -- over below, so the reaper stays quiet too.
    won = 2
    -- Members of channels added since that `online` never heard it: the caller announces to them.
    local before = redis.call('HGET', KEYS[5], 'c')
    if before then
      heard = '=' .. before
    end
  else
    won = 1
    -- The winner clears "somebody already said they left" so the next departure elects again.
    redis.call('DEL', KEYS[3])
    for i = 10, 9 + 2 * tonumber(ARGV[9]), 2 do
      redis.call('PUBLISH', ARGV[i], ARGV[i + 1])
    end
    -- Whether watchers were told: an invisible user's `online` went to their own connections
    -- only, so the reaper owes watchers no `offline` for them (REAP, VISIBILITY).
    redis.call('HSET', KEYS[5], 'h', ARGV[10 + 2 * tonumber(ARGV[9])])
    -- webhooks: the event, atomic with the decision
    if KEYS[7] then
      redis.call('XADD', KEYS[7], '*', 't', 'user.online', 'e', ARGV[6],
        'u', string.sub(ARGV[5], #ARGV[6] + 2), 'c', ARGV[8])
    end
  end
else
  -- A key a close re-pinned to the grace has a live connection again: back to the TTL,
  -- which this connection's instance now refreshes.
  redis.call('PEXPIRE', KEYS[2], ttl)
end
redis.call('ZADD', KEYS[4], now + ttl + tonumber(ARGV[3]), ARGV[5])
redis.call('HSET', KEYS[5], 'c', ARGV[8], 'e', epoch)
-- The epoch and its age: a young one means Redis lost its data moments ago (begin)
return {1, won, epoch, now - (tonumber(string.match(epoch, '@(%d+)$')) or 0), heard}
-- (end)
"""
)


# This script is delicate: the re-pin is what keeps a reconnect inside the grace from
# publishing a second `online` (docs/presence.md).
#
# KEYS: conns, key, epoch. ARGV: connection id, grace, "1" when it was the user's last local
# connection, fresh epoch. Frees the slot; on the last local close re-pins the key to the grace:
# without it the key dies at last refresh + TTL, possibly before the grace ends, and a reconnect
# in that gap wins the election and publishes a second `online` for a user who never left.
# Returns the epoch, which the grace check compares with its own.
#
# Equivalent Python:
#
#     del conns[connection_id]
#     if last_local:
#         conns = {c: expiry for c, expiry in conns.items() if expiry > now}
#         if not conns:
#             if key in redis:
#                 redis[key].expire(grace)                 # may shorten: nobody holds it
#         elif redis[key].pttl() < grace:
#             redis[key].expire(grace)                     # held elsewhere: only ever lengthen
#     return epoch
RELEASE = (
    _NOW
    + _EPOCH.format(epoch_key="KEYS[3]", fresh="ARGV[4]")
    + """
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[3] ~= '1' then
  return epoch
end
local grace = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) == 0 then
  -- XX: a key that already expired stays gone.
  redis.call('SET', KEYS[2], '1', 'PX', grace, 'XX')
  return epoch
end
-- Another instance still holds a connection and refreshes the key: extend, never shorten,
-- so a short grace cannot expire the key between two of its refreshes.
if redis.call('PTTL', KEYS[2]) < grace then
  redis.call('PEXPIRE', KEYS[2], grace)
end
return epoch
"""
)


# This script is delicate: it and REAP share the marker that elects exactly one `offline`.
#
# KEYS: key, marker, deadlines, channels, epoch. ARGV: marker ttl, member, the epoch the close
# saw, fresh epoch, the check's token (its transition id, the same on every retry), then
# (channel, payload) pairs to PUBLISH if this caller wins.
# Returns {0} = still online, {1, now} = won the right to publish `offline` (at `now`, Redis ms:
# the user's entries in their channels' online sets written before it are theirs to remove, any
# written after it are a return's), {2} = another instance
# (or the reaper) already did, {3, epoch} = Redis lost its data since the close (the epoch
# differs): decide nothing now, since the live holders re-elect the key at their next refresh,
# {4, now} = this very check won before and its reply was lost (the marker holds its token):
# nothing is PUBLISHed again, and a caller that publishes after the reply still owes it.
# The winner takes the user's deadline: a deadline only stands while the last word said of the
# user is `online` (ADMIT relies on it). Webhooks: with a 6th key (the user's bucket stream), ARGV
# 6 and 7 are the user's channel ids (comma-separated) and when they were last seen (unix ms),
# the pairs follow, and the winner's `user.offline` is XADDed there too.
#
# Equivalent Python:
#
#     if epoch != seen_epoch:
#         return [3, epoch]
#     if key in redis:
#         return [0]
#     if marker not in redis:
#         redis[marker] = expiring(marker_ttl, value=token)
#         del deadlines[member], redis[channels]
#         if stream:                                       # webhooks: the event, with the decision
#             redis.xadd(stream, t="user.offline", e=env, u=user, c=channel_ids, l=last_seen)
#         for channel, payload in publish:
#             redis.publish(channel, payload)
#         return [1, now]
#     if redis[marker] == token:                           # decided by this check, reply lost
#         return [4, now]
#     return [2]
GRACE_CHECK = (
    _NOW
    + _EPOCH.format(epoch_key="KEYS[5]", fresh="ARGV[4]")
    + """
if epoch ~= ARGV[3] then
  return {3, epoch}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0}
end
-- The marker holds the check's token: a retry of a check whose reply was lost knows its own.
if redis.call('SET', KEYS[2], ARGV[5], 'PX', ARGV[1], 'NX') then
  redis.call('ZREM', KEYS[3], ARGV[2])
  redis.call('DEL', KEYS[4])
  local first = 6
  -- webhooks: the event, atomic with the decision
  if KEYS[6] then
    first = 8
    redis.call('XADD', KEYS[6], '*', 't', 'user.offline', 'e', string.sub(ARGV[2], 1, 36),
      'u', string.sub(ARGV[2], 38), 'c', ARGV[6], 'l', ARGV[7])
  end
  for i = first, #ARGV, 2 do
    redis.call('PUBLISH', ARGV[i], ARGV[i + 1])
  end
  return {1, now}
end
-- (lost reply, begin)
if redis.call('GET', KEYS[2]) == ARGV[5] then
  return {4, now}
end
-- (end)
return {2}
"""
)


# ── a membership added ───────────────────────────────────────────────────────

# KEYS: key. ARGV: (channel, payload) pairs to PUBLISH if the user is online. The check and the
# publish in one script: an `offline` decided by a grace check (also a script) falls wholly
# before it, and then nothing is announced, or wholly after it, and then follows it.
#
# Equivalent Python:
#
#     if key not in redis:
#         return 0
#     for channel, payload in publish:
#         redis.publish(channel, payload)
#     return 1
ANNOUNCE = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for i = 1, #ARGV, 2 do
  redis.call('PUBLISH', ARGV[i], ARGV[i + 1])
end
return 1
"""


# KEYS: key, channels (the hash beside the deadline). ARGV: "1" when the user turned invisible,
# "0" when visible again, then (channel, payload) pairs to PUBLISH if the user is online. ANNOUNCE
# for a change of visibility: what watchers were told (`offline` then, `online` now) is written
# beside the deadline in the same step, so the reaper of a dead instance's invisible user tells
# them nothing more, and that of a visible one tells them `offline`. A hash Redis lost is not
# made again here (REFRESH writes it, without `h`: the reaper then says `offline` once more).
#
# Equivalent Python:
#
#     if key not in redis:
#         return 0
#     if channels in redis:
#         redis[channels]["h"] = hidden
#     for channel, payload in publish:
#         redis.publish(channel, payload)
#     return 1
VISIBILITY = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[2], 'h', ARGV[1])
end
for i = 2, #ARGV, 2 do
  redis.call('PUBLISH', ARGV[i], ARGV[i + 1])
end
return 1
"""


# ── every interval: refresh, reap ────────────────────────────────────────────

# This script is delicate and performance-sensitive: one call carries every user the instance
# holds in one bucket, so it holds Redis (the bucket's master) for as long as that list takes.
#
# KEYS: the bucket's deadlines and epoch, then per held user of the bucket: key, marker, conns,
# channels. ARGV: ttl, grace, fresh epoch, epoch ttl, then per held user: member, "=" and the
# user's channel ids (comma-separated) when they changed since this instance last wrote them or
# "" when not, n, n connection ids. One script per bucket per instance per interval, pipelined.
# Every refresh renews the epoch's TTL (see "The epoch's TTL" below). Returns
# {{member, had_marker, ...}, {member, ...}}: the keys found missing under a live connection
# (a Redis restart or eviction), which are re-elected, and the users whose channels are missing
# from Redis (the caller sends them next time).
#
# Equivalent Python:
#
#     redis[epoch_key].expire(epoch_ttl)
#     vanished, unwritten = [], []
#     for (member, channels, connection_ids), (key, marker, conns, info) in held:
#         if key in redis:
#             redis[key].expire(ttl)
#         else:                                            # lost under a live connection
#             redis[key] = expiring(ttl)
#             had_marker = redis.pop(marker, None) is not None
#             vanished += [member, had_marker]
#         for connection_id in connection_ids:
#             redis[conns][connection_id] = now + ttl
#         redis[conns].expire(ttl)
#         deadlines[member] = now + ttl + grace
#         if channels:                                     # "=a,b" when they changed
#             redis[info].update(c=channels[1:], e=epoch)
#         elif info not in redis:
#             unwritten.append(member)
#     return [vanished, unwritten]
REFRESH = (
    _NOW
    + _EPOCH.format(epoch_key="KEYS[2]", fresh="ARGV[3]")
    + """
local ttl = tonumber(ARGV[1])
local grace = tonumber(ARGV[2])
-- The epoch's TTL, renewed by every live instance (begin)
redis.call('PEXPIRE', KEYS[2], ARGV[4])
-- (end)
local vanished = {}
local unwritten = {}
local i = 5
local k = 3
while i <= #ARGV do
  local name = ARGV[i]
  local count = tonumber(ARGV[i + 2])
  if not redis.call('SET', KEYS[k], '1', 'PX', ttl, 'XX') then
    redis.call('SET', KEYS[k], '1', 'PX', ttl)
    -- Unconditionally: a stale "offline was said" must not stand against a connected user.
    local had_marker = redis.call('DEL', KEYS[k + 1])
    table.insert(vanished, name)
    table.insert(vanished, had_marker)
  end
  for j = 1, count do
    redis.call('ZADD', KEYS[k + 2], now + ttl, ARGV[i + 2 + j])
  end
  redis.call('PEXPIRE', KEYS[k + 2], ttl)
  redis.call('ZADD', KEYS[1], now + ttl + grace, name)
  if ARGV[i + 1] ~= '' then
    redis.call('HSET', KEYS[k + 3], 'c', string.sub(ARGV[i + 1], 2), 'e', epoch)
  elseif redis.call('EXISTS', KEYS[k + 3]) == 0 then
    table.insert(unwritten, name)
  end
  i = i + 3 + count
  k = k + 4
end
return {vanished, unwritten}
"""
)


# The first half of a reaper's pass over one bucket: which deadlines are due (their holder stopped
# refreshing: a dead instance). A script, not a read, for Redis's own clock; it also keeps the
# bucket's epoch alive (created when missing, renewed like REFRESH does) while any instance lives,
# so a bucket whose users' only holder died still has the epoch their deadlines were written in.
#
# KEYS: the bucket's deadlines and epoch. ARGV: fresh epoch, epoch ttl, batch. Returns Redis's
# time and the due members, at most a batch.
#
# Equivalent Python:
#
#     redis[epoch_key].expire(epoch_ttl)
#     return [now, [m for m, deadline in deadlines.items() if deadline <= now][:batch]]
DUE = (
    _NOW
    + _EPOCH.format(epoch_key="KEYS[2]", fresh="ARGV[1]")
    + """
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return {now, redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))}
"""
)


# This script is delicate and performance-sensitive: it decides `offline` for users nobody
# holds any more, and one call takes up to a batch of one bucket's (presence/store.py's REAP_BATCH).
#
# KEYS: the bucket's deadlines and epoch, the bucket's webhook stream when an environment listens,
# then per user DUE found: key, channels, marker. ARGV: marker ttl, grace, the wait for the live
# holders (two refresh intervals), fresh epoch, a uuid4 the transition ids are made from, the
# Redis channel prefix of the presence groups ("" when a script cannot publish to them: another
# Redis, or a cluster), the environments that listen for webhooks (comma-separated, "" for none),
# the TTL, the Redis time after which the script decides nothing (its DUE's plus a call's timeout:
# Redis was silent in between, and a holder may have let a user in without an election), then
# the members. Each member's deadline is looked at again (another instance's
# reaper, or a connect, may have taken it since DUE read it); a due one is decided through the
# same marker as the grace check, so a reaper and a grace check never both publish; with a
# prefix, the winner's `offline` is PUBLISHed here, to the channels kept beside the deadline, so
# no `online` of a reconnect can fall between the decision and the publish. A deadline written
# in another epoch than the bucket's waits for the live holders to re-elect first. The message is
# the channel layer's own encoding (msgpack) of `presence.fabric.transition_message`.
# An invisible user's watchers were told `offline` when the user turned invisible (`h` in the hash,
# VISIBILITY): nothing is published for them, and won is 2.
# Returns {member, won, channel ids (comma-separated), the id of the `offline` PUBLISHed here ("" for
# none), ...}. Webhooks: a winner of a listening
# environment has its `user.offline` XADDed to the bucket's stream.
#
# Equivalent Python:
#
#     decided = []
#     if now > not_after:
#         return decided
#     for member, (key, info, marker) in users:
#         deadline = deadlines.get(member)
#         if deadline is None or deadline > now:           # taken or renewed since DUE
#             continue
#         if key in redis:                                 # still held, or pinned by a close
#             deadlines[member] = now + max(redis[key].pttl(), 0) + grace
#         elif redis[info].get("e") not in (None, epoch):  # written before Redis lost its data
#             deadlines[member] = now + wait
#             redis[info]["e"] = epoch
#         else:
#             channels = redis[info].get("c", "")
#             hidden = redis[info].get("h") == "1"          # invisible: watchers heard `offline` then
#             del deadlines[member], redis[info]
#             won, transition = marker not in redis, ""
#             if won:
#                 redis[marker] = expiring(marker_ttl)
#                 if hidden:
#                     won = 2
#                 elif prefix:
#                     transition = next_transition_id()
#                     for channel in channels.split(","):
#                         redis.publish(prefix + channel, offline_message(member, channel, transition))
#                 if env in listening:                     # webhooks: the event, with the decision
#                     redis.xadd(stream, t="user.offline", e=env, u=user, c=channels,
#                                l=deadline - ttl - grace)
#             decided += [member, won, channels, transition]
#     return decided
REAP = (
    _NOW
    + _EPOCH.format(epoch_key="KEYS[2]", fresh="ARGV[4]")
    + """
if now > tonumber(ARGV[9]) then
  return {}
end
local prefix = ARGV[6]
local base = string.sub(ARGV[5], 1, 28)
local made = 0
local decided = {}
local listening = {}
local k = 3
for environment in string.gmatch(ARGV[7], '[^,]+') do
  listening[environment] = true
end
if ARGV[7] ~= '' then
  k = 4
end
for i = 10, #ARGV do
  local name = ARGV[i]
  local key, info, marker = KEYS[k], KEYS[k + 1], KEYS[k + 2]
  k = k + 3
  local deadline = tonumber(redis.call('ZSCORE', KEYS[1], name))
  if deadline and deadline <= now then
    local pttl = redis.call('PTTL', key)
    local written = redis.call('HGET', info, 'e')
    if pttl ~= -2 then
      -- Still held (or pinned by a close): look again once it could have expired.
      redis.call('ZADD', KEYS[1], now + math.max(pttl, 0) + tonumber(ARGV[2]), name)
    elseif written and written ~= epoch then
      redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), name)
      redis.call('HSET', info, 'e', epoch)
    else
      local csv = redis.call('HGET', info, 'c') or ''
      local hidden = redis.call('HGET', info, 'h') == '1'
      local environment = string.sub(name, 1, 36)
      redis.call('ZREM', KEYS[1], name)
      redis.call('DEL', info)
      local won = 0
      local transition = ''
      if redis.call('SET', marker, '1', 'PX', ARGV[1], 'NX') then
        won = 1
        if hidden then
          won = 2
        elseif prefix ~= '' then
          local channels = {}
          for channel in string.gmatch(csv, '[^,]+') do
            table.insert(channels, channel)
          end
          made = made + 1
          transition = base .. string.format('%08x', made)
          local user = string.sub(name, 38)
          for _, channel in ipairs(channels) do
            redis.call('PUBLISH', prefix .. channel, cmsgpack.pack({
              type = 'presence.transition', user = user, state = 'offline', transition = transition,
              channel = channel, copies = #channels}))
          end
        end
        -- webhooks: the event, atomic with the decision; a deadline is the last refresh + TTL +
        -- grace, so it says when they were last seen
        if listening[environment] then
          local last_seen = deadline - tonumber(ARGV[8]) - tonumber(ARGV[2])
          redis.call('XADD', KEYS[3], '*', 't', 'user.offline', 'e', environment,
            'u', string.sub(name, 38), 'c', csv, 'l', string.format('%d', last_seen))
        end
      end
      table.insert(decided, name)
      table.insert(decided, won)
      table.insert(decided, csv)
      table.insert(decided, transition)
    end
  end
end
return decided
"""
)


# ── a channel's online members ───────────────────────────────────────────────

# This script is performance-sensitive: every connect runs it once per channel of the user, and
# every refresh once per channel of the users the instance holds. It touches the one key of one
# channel (cluster-ready: declared in KEYS, the channel's hash tag).
#
# KEYS: the channel's online set. ARGV: for how long (ms from now) the users count as online,
# what to answer ("members": the online user ids, "count": how many, "score": the first user's
# score after the write, "": nothing), then the user ids seen online. A score is an expiry,
# renewed by the refresh, so an entry that no `offline` removed (an instance died between the
# user's script and this one) goes by itself; GT keeps a longer pin (a close's grace) from being
# shortened by a connect or refresh elsewhere.
#
# Equivalent Python:
#
#     online = {u: until for u, until in online.items() if until > now}
#     for user in users:
#         online[user] = max(online.get(user, 0), now + for_ms)
#     online.expire(max(online.pttl(), for_ms))
#     if answer == "members":
#         return list(online)
#     if answer == "count":
#         return len(online)
#     if answer == "score":
#         return online[users[0]]
#     return 0
CHANNEL_SEEN = (
    _NOW
    + """
local for_ms = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
for i = 3, #ARGV do
  redis.call('ZADD', KEYS[1], 'GT', now + for_ms, ARGV[i])
end
if redis.call('PTTL', KEYS[1]) < for_ms then
  redis.call('PEXPIRE', KEYS[1], for_ms)
end
if ARGV[2] == 'members' then
  return redis.call('ZRANGE', KEYS[1], 0, -1)
elseif ARGV[2] == 'count' then
  return redis.call('ZCARD', KEYS[1])
elseif ARGV[2] == 'score' then
  return redis.call('ZSCORE', KEYS[1], ARGV[3])
end
return 0
"""
)

# Take users out of a channel's online set, but only the entries written before a point in time:
# an entry scored `bound` or more was written (or renewed) after it, by a connect or refresh of a
# user who is back, and stands. Scores only ever grow (GT), so a later write is never hidden.
#
# KEYS: the channel's online set. ARGV: the bound (Redis ms), then the user ids.
#
# Equivalent Python:
#
#     for user in users:
#         if online.get(user, bound) < bound:
#             del online[user]
CHANNEL_UNSEEN = """
local bound = tonumber(ARGV[1])
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) < bound then
    redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return 0
"""

# Which of a snapshot's users were said to have left since their entries were written: the
# channels' online sets are read first, and whoever decides an `offline` takes the user out of
# them only after its script, on the channels' slots. A user whose key is gone and whose offline
# marker stands was said `offline` and has not been elected since (ADMIT deletes the marker); a
# key gone without the marker is a departure not decided yet, whose `offline` the watcher hears.
#
# KEYS: presence key and offline marker of each user (any number of users of one slot), read
# with `read_each`. Returns 1 or 0 for each key: whether it exists.
#
# Equivalent Python:
#
#     return [1 if key in redis else 0 for key in keys]
EXISTS_EACH = """
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('EXISTS', key)
end
return out
"""


# ── a membership removed ─────────────────────────────────────────────────────

# Drop one channel from the channels kept beside the user's deadline, for the reaper: the
# request that ended the membership does it, since the holders only write the list again at their
# next refresh, and one that dies first would leave the reaper telling that channel's members of
# a user they no longer share it with. One id taken out, not the list written whole: an addition
# written meanwhile by a holder stays.
#
# KEYS: the user's channels hash. ARGV: the channel id.
#
# Equivalent Python:
#
#     if "c" in channels_hash:
#         channels_hash["c"] = ",".join(c for c in channels_hash["c"].split(",") if c and c != channel_id)
CHANNEL_LEFT = """
local csv = redis.call('HGET', KEYS[1], 'c')
if not csv then
  return 0
end
local kept = {}
for channel in string.gmatch(csv, '[^,]+') do
  if channel ~= ARGV[1] then
    table.insert(kept, channel)
  end
end
redis.call('HSET', KEYS[1], 'c', table.concat(kept, ','))
return 1
"""

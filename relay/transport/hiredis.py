"""redis-py's asyncio connections, packing commands with hiredis's C packer.

Written against redis-py 5 and 6 (requirements.txt): it mixes `pack_command`/`pack_commands`
into the pool's connection class. Upstream: redis/redis-py#4176 (open; PR #4191 would make
asyncio connections pack with hiredis themselves, and this module unnecessary). Guard:
tests/test_transport_guards.py.
"""

import functools

import hiredis
import redis.asyncio as aioredis
from redis.exceptions import DataError


class _HiredisPacking:
    """Packs commands with hiredis's C packer, as redis-py's blocking connections already do.

    redis-py's asyncio connections always pack in Python: an encode, a length header and a
    join per argument. A connect's election script carries ≈ 17 arguments; packing and parsing
    them in Python measured ≈ 14 % of the event loop's instructions per connect. The arguments
    are split and encoded as redis-py's own HiredisRespSerializer does, so the bytes on the wire
    are the same.
    """

    def pack_command(self, *args: object) -> list[bytes]:
        return [_pack(args)]

    def pack_commands(self, commands: object) -> list[bytes]:
        return [b"".join(_pack(tuple(command)) for command in commands)]


def _pack(args: tuple) -> bytes:
    # A command name may hold several words ("CLIENT SETNAME"): each is its own argument.
    if isinstance(args[0], str):
        args = (*args[0].encode().split(), *args[1:])
    elif b" " in args[0]:
        args = (*args[0].split(), *args[1:])
    try:
        return hiredis.pack_command(args)
    except TypeError as error:
        # redis-py's error type for an argument it cannot send (None, a bool, a dict...).
        raise DataError(str(error)) from error


@functools.cache
def _packing(connection_class: type) -> type:
    if issubclass(connection_class, _HiredisPacking):
        return connection_class
    return type(f"Hiredis{connection_class.__name__}", (_HiredisPacking, connection_class), {})


def pack_with_hiredis(pool: aioredis.ConnectionPool) -> aioredis.ConnectionPool:
    """Make the connections `pool` opens from now on pack commands in C; returns the pool.

    The class the URL chose (plain TCP, TLS, unix socket) is kept, with the packing mixed in.
    """
    pool.connection_class = _packing(pool.connection_class)
    return pool

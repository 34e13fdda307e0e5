"""Connection tokens: short-lived HS256 JWTs bound to one environment and one user.

Each environment signs with its own secret, so a tenant's backend may mint tokens
itself (claims `env`, `sub`, `iat`, `exp`, and optionally `jti`) and a token can never open a
connection in another tenant: its signature only verifies against the secret of the `env` it
names. However it was minted, a token living longer than RELAY_MAX_TOKEN_TTL_S is refused.
"""

import secrets
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import jwt
import orjson
from django.conf import settings
from django.db.models.signals import post_save
from django.dispatch import receiver
from django.utils import timezone
from jwt.utils import base64url_decode

from relay.exceptions import InvalidToken
from relay.models import Environment, User, new_signing_secret
from relay.queries import user_by_external_id

ALGORITHM = "HS256"
DEFAULT_TTL_SECONDS = 3600
# How far ahead of this host's clock a minting backend's may run: a token issued "in the future"
# by that much is accepted. Only `iat`: `exp` is held to this host's clock, so a token is refused
# the moment the `expires_at` the API reported has passed.
CLOCK_SKEW_SECONDS = 30
_REQUIRED_CLAIMS = ["env", "sub", "iat", "exp"]
# How long a process trusts the signing secret it read for an environment. A rotation in this
# process forgets it at once, and every other process when the rotation's notice arrives or at
# its next reconciliation (relay/reconcile.py), which also closes any connection a token signed
# with the OLD secret opened meanwhile. A token signed with the NEW one is checked once more
# against the database's secret when the cached one refuses it.
SECRET_CACHE_SECONDS = 10.0
# How often a signature that fails may send the process back to the database, per environment,
# and how often an `env` claim naming no environment this process knows may re-read the list of
# environments. A forged token then costs no query: a flood of them costs one a second. (A new
# secret is refused for at most this long, and only if a forged token came just before it and the
# rotation's notice has not arrived.)
RECHECK_SECONDS = 1.0

_environments: dict[uuid.UUID, tuple[float, Environment]] = {}
_rechecked: dict[uuid.UUID, float] = {}
# When the ids of every environment were last read, and the ids.
_known: tuple[float, frozenset[uuid.UUID]] = (float("-inf"), frozenset())
_environments_lock = threading.Lock()


# The claims every token must carry, given once rather than to each `decode`.
_CODEC = jwt.PyJWT(options={"require": _REQUIRED_CLAIMS})


def _environment(environment_id: uuid.UUID) -> Environment | None:
    """The environment (with its signing secret), from this process's cache; None when unknown."""
    global _known
    now = time.monotonic()
    cached = _environments.get(environment_id)
    if cached is not None and cached[0] > now:
        return cached[1]
    read_at, known = _known
    if cached is None and environment_id not in known and now - read_at < RECHECK_SECONDS:
        return None
    environment = _read_environment(environment_id, now)
    if environment is None:
        # Unknown: every id is read once, so the next unknown ones are refused without a query.
        _known = (now, frozenset(Environment.objects.values_list("id", flat=True)))
    return environment


def _read_environment(environment_id: uuid.UUID, now: float) -> Environment | None:
    environment = Environment.objects.filter(id=environment_id).first()
    with _environments_lock:
        if environment is None:
            # Unknown ids are not remembered here: forged ones would grow the cache without bound.
            _environments.pop(environment_id, None)
        else:
            _environments[environment_id] = (now + SECRET_CACHE_SECONDS, environment)
    return environment


def _recheck(environment_id: uuid.UUID) -> Environment | None:
    """The environment read afresh after its cached secret refused a signature; None if it was just read."""
    now = time.monotonic()
    if now - _rechecked.get(environment_id, float("-inf")) < RECHECK_SECONDS:
        return None
    _rechecked[environment_id] = now
    return _read_environment(environment_id, now)


@receiver(post_save, sender=Environment)
def _environment_created(created: bool, **_: object) -> None:
    """A tenant created in this process may be named at once: the list of ids is read again."""
    global _known
    if created:
        _known = (float("-inf"), frozenset())


def forget_environment(environment_id: str | uuid.UUID) -> None:
    """Drop this process's cached secret of the environment: the next token is checked against the database's."""
    environment_id = uuid.UUID(str(environment_id))
    with _environments_lock:
        _environments.pop(environment_id, None)
        _rechecked.pop(environment_id, None)


def rotate_signing_secret(environment: Environment) -> None:
    """Replace the environment's signing secret; tokens signed with the old one stop working."""
    environment.signing_secret = new_signing_secret()
    environment.secret_rotated_at = timezone.now()
    environment.save(update_fields=["signing_secret", "secret_rotated_at"])
    forget_environment(environment.id)


def mint_token(
    environment: Environment, user_id: str, ttl_seconds: int = DEFAULT_TTL_SECONDS, now: datetime | None = None
) -> tuple[str, datetime]:
    """Return a token for `user_id` in `environment` and the moment it expires."""
    issued = (now or datetime.now(UTC)).replace(microsecond=0)
    expires = issued + timedelta(seconds=ttl_seconds)
    # `jti`: two tokens minted for one user in one second are still two different credentials.
    claims = {"env": str(environment.id), "sub": user_id, "iat": issued, "exp": expires}
    claims["jti"] = secrets.token_urlsafe(12)
    return _CODEC.encode(claims, environment.signing_secret, algorithm=ALGORITHM), expires


def verify_token(token: str | None) -> User:
    """Return the user a valid token names, or raise InvalidToken."""
    environment, subject = authenticate(token)
    user = user_by_external_id(environment.id, subject)
    if user is None:
        raise InvalidToken("unknown user")
    # The cached environment, as select_related would have loaded it: no query if code reads it.
    user.environment = environment
    return user


def authenticate(token: str | None) -> tuple[Environment, str]:
    """The environment a valid token was signed for and the user id it names; raise InvalidToken.

    Whether that user exists is the caller's to check (`verify_token`, or a connect batch's one
    read of its users).
    """
    if not token:
        raise InvalidToken("missing token")
    environment_id = _claimed_environment(token)
    environment = _environment(environment_id)
    if environment is None:
        raise InvalidToken("unknown environment")
    try:
        claims = _verified_claims(token, environment.signing_secret)
    except jwt.InvalidSignatureError:
        # Perhaps signed with a secret rotated in another process since this one cached its own.
        environment = _recheck(environment_id)
        if environment is None:
            raise InvalidToken("InvalidSignatureError") from None
        try:
            claims = _verified_claims(token, environment.signing_secret)
        except jwt.InvalidTokenError as error:
            raise InvalidToken(type(error).__name__) from error
    except jwt.InvalidTokenError as error:
        raise InvalidToken(type(error).__name__) from error
    subject = claims["sub"]
    if not isinstance(subject, str):
        raise InvalidToken("malformed subject")
    # PyJWT has checked that both read as integers, and `iat` is no later than now + the skew; its
    # `exp` check allowed the same skew, which expiry does not get.
    if int(claims["exp"]) <= time.time():
        raise InvalidToken("ExpiredSignatureError")
    if int(claims["exp"]) - int(claims["iat"]) > settings.RELAY_MAX_TOKEN_TTL_S:
        raise InvalidToken("lifetime over RELAY_MAX_TOKEN_TTL_S")
    return environment, subject


def _claimed_environment(token: str) -> uuid.UUID:
    """The token's `env` claim, UNVERIFIED: only to learn which environment's secret to verify with.

    Nothing read here is trusted until PyJWT has checked the signature, the algorithm and every
    claim. The payload is read directly rather than through a second, unverified `jwt.decode`,
    which would cost as much as the verified one.
    """
    try:
        claims = orjson.loads(base64url_decode(token.split(".")[1]))
        if not isinstance(claims, dict):
            raise ValueError("claims are not an object")
        return uuid.UUID(str(claims.get("env")))
    except (IndexError, ValueError, TypeError) as error:
        raise InvalidToken("malformed token") from error


def _verified_claims(token: str, secret: str) -> dict:
    return _CODEC.decode(token, secret, algorithms=[ALGORITHM], leeway=CLOCK_SKEW_SECONDS)

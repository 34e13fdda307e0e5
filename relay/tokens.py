"""Connection tokens: short-lived HS256 JWTs bound to one environment and one user.

Each environment signs with its own secret, so a tenant's backend may mint tokens
itself (claims `env`, `sub`, `iat`, `exp`) and a token can never open a session in
another tenant: its signature only verifies against the secret of the `env` it names.
"""

import binascii
import functools
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import jwt
import orjson
from jwt.algorithms import HMACAlgorithm
from jwt.api_jws import _BASE64URL_ALPHABET, PyJWS
from jwt.utils import base64url_decode, base64url_encode

from relay.connect_reads import user_by_external_id
from relay.exceptions import InvalidToken
from relay.models import Environment, User

ALGORITHM = "HS256"
DEFAULT_TTL_SECONDS = 3600
MAX_TTL_SECONDS = 24 * 3600
_REQUIRED_CLAIMS = ["env", "sub", "iat", "exp"]
# How long a process trusts the signing secret it read for an environment. A rotation in this
# process forgets it at once; another process keeps accepting tokens signed with the OLD secret
# for up to this long (a token signed with the NEW one is never refused: a signature that fails
# against a cached secret is checked once more against the database's).
SECRET_CACHE_SECONDS = 10.0

# Secrets whose key checks this process remembers: one per environment it serves at a time.
PREPARED_SECRETS = 1024

_environments: dict[uuid.UUID, tuple[float, Environment]] = {}
_environments_lock = threading.Lock()


class _HS256(HMACAlgorithm):
    """HS256 that checks a secret once per process, not once per token.

    On every encode and decode PyJWT checks that an HMAC secret is no asymmetric key (PEM, SSH,
    DER, which has `cryptography` try to parse it twice) and no JWK JSON: ≈ 9 µs of a ≈ 40 µs
    decode, on every connect (docs/performance.md). The answer for a secret never changes, so it
    is remembered; a secret the checks refuse raises every time, as before, and is not remembered.
    """

    def __init__(self) -> None:
        super().__init__(HMACAlgorithm.SHA256)
        self.prepared = functools.lru_cache(maxsize=PREPARED_SECRETS)(super().prepare_key)

    def prepare_key(self, key: str | bytes) -> bytes:
        return self.prepared(key)


class _JWS(PyJWS):
    """PyJWS whose check of a token's base64url segments runs in C, not one Python step a character.

    PyJWT checks every character of each segment against the base64url alphabet in a generator
    (GHSA-hxm8-2xgr-2p9m: junk that Python's lenient decoder would drop). For a Relay token that
    was ≈ 0.1 M of the ≈ 0.27 M instructions of a decode, on every connect (docs/performance.md).
    This is the same check, step for step, with the alphabet test as one `bytes.translate`.
    `test_tokens` holds it to PyJWT's own on every short segment and fails as soon as PyJWT's own
    changes, so an upstream fix is never masked.
    """

    @staticmethod
    def _decode_base64url_segment(segment: bytes, name: str) -> bytes:
        stripped = segment.rstrip(b"=")
        padding = len(segment) - len(stripped)
        if (
            padding > 2
            or (padding and len(segment) % 4)
            or len(stripped) % 4 == 1
            or stripped.translate(None, _BASE64URL_ALPHABET)
        ):
            raise jwt.DecodeError(f"Invalid {name} padding")
        try:
            decoded = base64url_decode(stripped)
        except (TypeError, binascii.Error) as error:
            raise jwt.DecodeError(f"Invalid {name} padding") from error
        # Canonical encodings only: unused low bits of the last character must be zero.
        if base64url_encode(decoded) != stripped:
            raise jwt.DecodeError(f"Invalid {name} padding")
        return decoded


def _codec() -> jwt.PyJWT:
    """Relay's PyJWT, built once: its own JWS layer and HS256, and the claims every token must carry.

    Options given once here rather than to each `decode`, which merges them on every call (≈ 6 µs).
    PyJWT keeps an instance's JWS layer, and with it the algorithms, on `_jws` and offers no public
    way to reach it: `test_tokens` fails if that stops holding.
    """
    codec = jwt.PyJWT(options={"require": _REQUIRED_CLAIMS})
    codec._jws = _JWS(options=codec._jws.options)
    codec._jws.unregister_algorithm(ALGORITHM)
    codec._jws.register_algorithm(ALGORITHM, _HS256())
    return codec


_CODEC = _codec()


def _environment(environment_id: uuid.UUID, *, fresh: bool = False) -> Environment | None:
    """The environment (with its signing secret), from this process's cache unless `fresh`; None when unknown."""
    now = time.monotonic()
    cached = _environments.get(environment_id)
    if cached is not None and not fresh and cached[0] > now:
        return cached[1]
    environment = Environment.objects.filter(id=environment_id).first()
    with _environments_lock:
        if environment is None:
            # Unknown ids are not remembered: forged ones would grow the cache without bound.
            _environments.pop(environment_id, None)
        else:
            _environments[environment_id] = (now + SECRET_CACHE_SECONDS, environment)
    return environment


def forget_secret(environment_id: uuid.UUID) -> None:
    """Drop this process's cached environment (its secret was rotated)."""
    with _environments_lock:
        _environments.pop(environment_id, None)


def mint_token(
    environment: Environment, user_id: str, ttl_seconds: int = DEFAULT_TTL_SECONDS, now: datetime | None = None
) -> tuple[str, datetime]:
    """Return a token for `user_id` in `environment` and the moment it expires."""
    issued = (now or datetime.now(UTC)).replace(microsecond=0)
    expires = issued + timedelta(seconds=ttl_seconds)
    claims = {"env": str(environment.id), "sub": user_id, "iat": issued, "exp": expires}
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
        environment = _environment(environment_id, fresh=True)
        if environment is None:
            raise InvalidToken("unknown environment") from None
        try:
            claims = _verified_claims(token, environment.signing_secret)
        except jwt.InvalidTokenError as error:
            raise InvalidToken(type(error).__name__) from error
    except jwt.InvalidTokenError as error:
        raise InvalidToken(type(error).__name__) from error
    subject = claims["sub"]
    if not isinstance(subject, str):
        raise InvalidToken("malformed subject")
    return environment, subject


def _claimed_environment(token: str) -> uuid.UUID:
    """The token's `env` claim, UNVERIFIED: only to learn which environment's secret to verify with.

    Nothing read here is trusted until PyJWT has checked the signature, the algorithm and every
    claim. The payload is read directly rather than through a second, unverified `jwt.decode`,
    which costs as much as the verified one (≈ 30 µs a connect, docs/performance.md).
    """
    try:
        claims = orjson.loads(base64url_decode(token.split(".")[1]))
        if not isinstance(claims, dict):
            raise ValueError("claims are not an object")
        return uuid.UUID(str(claims.get("env")))
    except (IndexError, ValueError, TypeError) as error:
        raise InvalidToken("malformed token") from error


def _verified_claims(token: str, secret: str) -> dict:
    return _CODEC.decode(token, secret, algorithms=[ALGORITHM])

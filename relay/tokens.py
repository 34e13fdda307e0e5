"""Connection tokens: short-lived HS256 JWTs bound to one environment and one user.

Each environment signs with its own secret, so a tenant's backend may mint tokens
itself (claims `env`, `sub`, `iat`, `exp`) and a token can never open a session in
another tenant: its signature only verifies against the secret of the `env` it names.
"""

import uuid
from datetime import UTC, datetime, timedelta

import jwt

from relay.exceptions import InvalidToken
from relay.models import Environment, User

ALGORITHM = "HS256"
DEFAULT_TTL_SECONDS = 3600
MAX_TTL_SECONDS = 24 * 3600
_REQUIRED_CLAIMS = ["env", "sub", "iat", "exp"]


def mint_token(
    environment: Environment, user_id: str, ttl_seconds: int = DEFAULT_TTL_SECONDS, now: datetime | None = None
) -> tuple[str, datetime]:
    """Return a token for `user_id` in `environment` and the moment it expires."""
    issued = (now or datetime.now(UTC)).replace(microsecond=0)
    expires = issued + timedelta(seconds=ttl_seconds)
    claims = {"env": str(environment.id), "sub": user_id, "iat": issued, "exp": expires}
    return jwt.encode(claims, environment.signing_secret, algorithm=ALGORITHM), expires


def verify_token(token: str | None) -> User:
    """Return the user a valid token names, or raise InvalidToken."""
    if not token:
        raise InvalidToken("missing token")
    try:
        # Unverified only to learn which environment's secret to verify with; nothing
        # from this read is trusted until the signature below checks out.
        unverified = jwt.decode(token, options={"verify_signature": False})
        environment_id = uuid.UUID(str(unverified.get("env")))
    except (jwt.InvalidTokenError, ValueError) as error:
        raise InvalidToken("malformed token") from error
    environment = Environment.objects.filter(id=environment_id).first()
    if environment is None:
        raise InvalidToken("unknown environment")
    try:
        claims = jwt.decode(
            token, environment.signing_secret, algorithms=[ALGORITHM], options={"require": _REQUIRED_CLAIMS}
        )
    except jwt.InvalidTokenError as error:
        raise InvalidToken(type(error).__name__) from error
    subject = claims["sub"]
    if not isinstance(subject, str):
        raise InvalidToken("malformed subject")
    user = User.objects.select_related("environment").filter(environment=environment, external_id=subject).first()
    if user is None:
        raise InvalidToken("unknown user")
    return user

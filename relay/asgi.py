"""ASGI entry point: `daphne relay.asgi:application` serves HTTP and WebSocket."""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "relay.settings")
# Django must be set up before anything imports models (the consumer does).
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from relay.layer import check_channel_layer  # noqa: E402
from relay.routing import websocket_urlpatterns  # noqa: E402
from webhooks.worker import StartWorker  # noqa: E402

# A layer without Relay's hooks fails here, at start-up, naming what it lacks.
check_channel_layer()

# The webhook worker starts with the first request or connection (webhooks/worker.py).
application = StartWorker(
    ProtocolTypeRouter(
        {
            # Daphne serves no files itself (only `runserver` adds this handler), so without
            # it /static/ is a 404 and admin renders unstyled. Files come from the apps'
            # static/ folders through Django's finders: no collectstatic step.
            "http": ASGIStaticFilesHandler(django_asgi_app),
            # No AllowedHostsOriginValidator: clients authenticate with a token in the
            # URL, not a cookie, so a cross-origin page gains nothing by connecting.
            "websocket": URLRouter(websocket_urlpatterns),
        }
    )
)

# What start-up built (Django, the apps, their modules) lives as long as the process: kept out of
# the full collections that free closed connections' cycles (relay/serve.py), which then walk
# only what serving made.
gc.freeze()

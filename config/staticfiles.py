"""Static files: hashed and compressed by ``collectstatic``, served by WhiteNoise.

``collectstatic`` writes each file under a name with its content hash (plus ``.gz`` and
``.br`` copies) into ``STATIC_ROOT`` with a manifest, and WhiteNoise serves those names
with a far-future cache header: a new release changes the names, so no browser keeps an
old stylesheet.

Where ``collectstatic`` has not run (a checkout: the demo, the tests, the benchmarks),
there is no manifest, and a name is used as it is instead of stopping the page with
"Missing staticfiles manifest entry"; WhiteNoise then finds the files where they are
(``WHITENOISE_USE_FINDERS`` in the settings). Once a manifest exists it is strict: a
file missing from it is an error, as it would be in production.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest
from whitenoise.middleware import WhiteNoiseMiddleware
from whitenoise.storage import CompressedManifestStaticFilesStorage


class ConsoleStaticFilesStorage(CompressedManifestStaticFilesStorage):
    def stored_name(self, name: str) -> str:
        # No manifest was loaded when this storage was made: collectstatic has not run.
        # (collectstatic itself names files through _stored_name, not this.)
        if not self.hashed_files:
            return name
        stored: str = super().stored_name(name)
        return stored


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """WhiteNoise's middleware, async-capable, so that under ASGI a request that is not for
    a static file goes on down the chain on the event loop: WhiteNoise's own middleware is
    sync only, and one sync middleware makes Django run the chain below it in a thread.

    The lookup is WhiteNoise's: a dict read of the collected files, or, where nothing was
    collected (``autorefresh``: the demo, the tests), its finders, which touch the
    filesystem and so run in a thread. ``files``, ``autorefresh``, ``find_file`` and
    ``serve`` are what WhiteNoise's own ``__call__`` uses (whitenoise 6.x)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        super().__init__(get_response)
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if iscoroutinefunction(self):
            return self.__acall__(request)
        return super().__call__(request)

    async def __acall__(self, request: HttpRequest) -> Any:
        if self.autorefresh:
            static_file = await sync_to_async(self.find_file)(request.path_info)
        else:
            static_file = self.files.get(request.path_info)
        if static_file is not None:
            return await sync_to_async(self.serve)(static_file, request)
        return await self.get_response(request)

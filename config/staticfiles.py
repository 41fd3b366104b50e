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

from whitenoise.storage import CompressedManifestStaticFilesStorage


class ConsoleStaticFilesStorage(CompressedManifestStaticFilesStorage):
    def stored_name(self, name: str) -> str:
        # No manifest was loaded when this storage was made: collectstatic has not run.
        # (collectstatic itself names files through _stored_name, not this.)
        if not self.hashed_files:
            return name
        stored: str = super().stored_name(name)
        return stored

"""The dashboard's static files: a fixed allow-list read from this package, never a path from a request.

The charting library is Chart.js, vendored as its released UMD build so that the grader serves it
itself (clusters are often air-gapped: no CDN). ``make vendor-chartjs`` fetches exactly this release
from the npm registry and checks its integrity; a test checks the file against ``CHARTJS_SHA256``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.resources import files

CHARTJS_VERSION = "4.6.1"
#: sha256 of ``package/dist/chart.umd.min.js`` in chart.js-4.6.1.tgz.
CHARTJS_SHA256 = "87364cc2b2a76a6684929e7d6b80b18a897794db38400caff1fcf1791c6925d2"
CHARTJS_FILE = "vendor/chart.umd.min.js"
CHARTJS_LICENSE_FILE = "vendor/chart.js.LICENSE.md"


@dataclass(frozen=True)
class Asset:
    media_type: str
    #: Served without a session: what the sign-in page itself needs.
    public: bool = False


ASSETS: dict[str, Asset] = {
    "login.html": Asset("text/html; charset=utf-8", public=True),
    "dashboard.css": Asset("text/css; charset=utf-8", public=True),
    "experiments.html": Asset("text/html; charset=utf-8"),
    "experiment.html": Asset("text/html; charset=utf-8"),
    "dashboard.js": Asset("text/javascript; charset=utf-8"),
    "summary.html": Asset("text/html; charset=utf-8"),
    "summary.js": Asset("text/javascript; charset=utf-8"),
    CHARTJS_FILE: Asset("text/javascript; charset=utf-8"),
    CHARTJS_LICENSE_FILE: Asset("text/plain; charset=utf-8"),
}


@cache
def asset_bytes(name: str) -> bytes:
    """The content of an allow-listed asset (KeyError for any other name)."""
    if name not in ASSETS:
        raise KeyError(name)
    return files(__package__).joinpath("static", *name.split("/")).read_bytes()

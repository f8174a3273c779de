"""The results of a study as a typed model: one format version, its upgrade chain, one load.

Analysis builds the results document (:func:`virtlab.analysis.build_results`); results.json is that
document. Every exporter reads :class:`Results`, built from it once (:meth:`Results.of`,
:func:`load_results`), never the document's dicts. A scenario's section stays a mapping here
(:meth:`Results.section`); its typed model lives in ``virtlab/results/<scenario>.py``.
"""

from virtlab.results.format import FORMAT_VERSION, UPGRADES, upgrade_results
from virtlab.results.model import (
    DEFAULT_REDUCTION,
    ENVIRONMENT_KIND,
    Cell,
    Environment,
    Failure,
    Host,
    HostDifference,
    ManifestDifference,
    Metadata,
    Results,
    Study,
    Workload,
    finite,
    load_results,
    verdict_of,
)
from virtlab.results.sweep import SweepPoint, fio_sweep_point

__all__ = [
    "DEFAULT_REDUCTION",
    "ENVIRONMENT_KIND",
    "FORMAT_VERSION",
    "UPGRADES",
    "Cell",
    "Environment",
    "Failure",
    "Host",
    "HostDifference",
    "ManifestDifference",
    "Metadata",
    "Results",
    "Study",
    "SweepPoint",
    "Workload",
    "finite",
    "fio_sweep_point",
    "load_results",
    "upgrade_results",
    "verdict_of",
]

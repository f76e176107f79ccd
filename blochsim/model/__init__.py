"""`Simulator`, `SpinPhysics`, `EventOperators` and the presets.

A `Simulator` subclass implements `layout()` (an event train, simulated by the EPG engine) or
`evaluate()` (a closed form). Its public edge takes protocol in ms and degrees and tissue by the public
tissue names (PUBLIC_FIELDS); `layout()` converts units when it calls operators.

Calls that change only values are cheap: the structure of a layout is keyed by its structural arguments
(Python numbers, strings, the shapes of arrays) and the run settings. The first call of a key walks the
layout and compiles it; the second resolves the program's values as an affine map of the protocol
tensors (`blochsim.engine.affine.AffineValues`), checked against the first call's values; later calls
evaluate that map and call the kernels directly (docs/design.md, "Structure resolution").

The package: `vocabulary` (public names, units, settings, `SpinPhysics`, `EventOperators`), `simulator`
(`Simulator`: routing, structure cache, engine dispatch, Jacobians), `arguments` (checks of what a call
passes), `placement` (where protocol values live per call), `reemit` (`from_description`).
"""

# Re-exported: the names other modules and tests take from `blochsim.model` (and `_on_device`, which
# tests/test_device_caches.py calls).
from .arguments import POSITIVE_TIMES as POSITIVE_TIMES
from .placement import _on_device as _on_device
from .placement import on_host as on_host
from .simulator import Simulator
from .vocabulary import (
           BALANCED,
           PUBLIC_FIELDS,
           REFOCUSED,
           RUN_SETTINGS,
           SPOILED,
           UNBALANCED,
           EventOperators,
           SpinPhysics,
)
from .vocabulary import UNITS as UNITS

__all__ = ["Simulator", "SpinPhysics", "EventOperators", "BALANCED", "UNBALANCED", "SPOILED", "REFOCUSED",
           "PUBLIC_FIELDS", "RUN_SETTINGS"]

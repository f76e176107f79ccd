"""The structure cache and affine value resolution of a `Simulator` (docs/design.md, "Structure resolution").

A call's layout is keyed by its structural arguments and run settings; the first call of a key walks and
compiles it, the second fits its values as an affine map of the protocol tensors and checks the map, and
later calls evaluate the map. `StructureCache` is a mixin of `Simulator`: it reads the instance's
`_cache`, `_resolve`, `_stored`, `structural` and `post_rotation_rad`, and its `_compose` and
`_check_required`.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict

import torch

from .. import _native as nat
from ..engine.affine import AffineValues
from ..engine.program import compile_program, values_of, windings
from ..sequence.spinor import slice_profile_of
from .arguments import _hashable
from .placement import _protocol_vector, _unchanged, _versions, on_host
from .vocabulary import _CACHE_SIZE

__all__ = ["StructureCache"]


class _Entry:
    """One structure: its program, and the values as an affine map of the protocol once resolved."""

    __slots__ = ("program", "windings", "p_ref", "values_ref", "affine", "verified", "state", "keep", "seen")

    def __init__(self, program, windings, p, values, keep):
        self.program, self.windings, self.keep = program, windings, keep
        self.p_ref, self.values_ref = p.detach().clone(), tuple(v.detach() for v in values)
        self.affine, self.verified, self.state = None, False, "seen"
        self.seen = ()  # `_versions` of the protocol tensors p_ref was read from


class _Cache:
    def __init__(self) -> None:
        self.entries: OrderedDict = OrderedDict()

    def get(self, key):
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
        return entry

    def put(self, key, entry) -> None:
        self.entries[key] = entry
        if len(self.entries) > _CACHE_SIZE:
            self.entries.popitem(last=False)


def _structure(program) -> tuple:
    """What must agree for two programs to share values: everything but the INTERVAL bits and the values.

    The RF frequencies and saturation constants (read by the semisolid lineshape, not part of the affine
    values) are structure: a protocol that moves them is walked every call, never served stale ones.
    """
    rows = b"".join(b"-" if r is None else r.tobytes()
                    for r in (program.field_row, program.profile_row, program.spinor_row))
    return (bytes((program.action & ~nat.INTERVAL).astype("int32")), bytes(program.record),
            program.rf_hz.tobytes() + program.sat_per_rad2.tobytes() + rows, program.path, program.num_samples,
            program.num_states, program.num_repetitions, program.crusher_dk_rad_per_m, program.voxel_size_m)


def _second_point(x: torch.Tensor) -> torch.Tensor:
    """A protocol tensor moved to check an affine map away from the point it was fitted at: each entry by 1/64
    to 5/64 of its size and its tensor's mean size (1 where that is 0), unevenly along the entries. Not a
    scaling: a layout homogeneous in its protocol (a flip train normalised to its largest flip) agrees with
    its linearisation along every scaling of the point, and is not affine."""
    flat = x.reshape(-1)
    size = flat.abs()
    steps = (1 + torch.arange(flat.numel(), device=flat.device) % 5).to(size.dtype) / 64
    mean = float(size.mean()) if flat.numel() else 0.0
    return (flat + steps * (size + (mean or 1.0))).reshape(x.shape)


class StructureCache:
    """`Simulator._program` and its helpers: the compiled program and values of a call, cached by structure."""

    def _program(self, protocol, settings, states, repetitions, record, complex_states, dtype=torch.float64,
                 device=None):
        """(program, values, windings, wrapped) for a call: cached and resolved where possible (docs/design.md).

        Resolved values come in `dtype` with their phases wrapped (`wrapped` True), on the device of the
        protocol vector (`_protocol_vector`: the CPU, or `device`, where the work runs, when a protocol
        tensor is elsewhere); walked values are the program's own float64 arrays, on the CPU.
        """
        profile = slice_profile_of(self._setting(settings, "across_slice"))
        profile_key = None if profile is None else profile.key()
        if self._stored is not None:
            key = ("stored", states, repetitions, record, complex_states, profile_key)
            entry = self._cache.get(key)
            if entry is None or not entry.program.current:  # a tensor of the description changed in place
                program, windings = self._walk(None, settings, states, repetitions, record, complex_states)
                values = values_of(program)
                if program.sources is None:
                    return program, values, windings, False  # a differentiable description: compile every call
                entry = _Entry(program, windings, torch.zeros(0), values, None)
                self._cache.put(key, entry)
            return entry.program, entry.values_ref, entry.windings, False

        args, key, leaves = self._layout_args(protocol)
        if not self._resolve:
            program, windings = self._walk(args, settings, states, repetitions, record, complex_states)
            return program, values_of(program), windings, False
        p = _protocol_vector(leaves, device)
        key = (tuple(key), states, repetitions, record, complex_states, id(settings.get("pulse")),
               id(settings.get("shims")), p.device, profile_key)
        entry = self._cache.get(key)
        if entry is None:
            program, windings = self._walk(args, settings, states, repetitions, record, complex_states)
            values = values_of(program)
            entry = _Entry(program, windings, p, values, [settings.get("pulse"), settings.get("shims")])
            entry.seen = _versions(leaves)
            self._cache.put(key, entry)
            return program, values, windings, False
        if entry.state == "resolved":
            # The same tensors, unchanged, hold the same values: on a GPU no comparison (a wait for the card).
            same = not p.is_cpu and _unchanged(entry.seen, leaves)
            if entry.verified or same or torch.equal(p.detach(), entry.p_ref):
                return entry.program, entry.affine(p, dtype, wrap_last=True), entry.windings, True
            return self._verify(entry, p, args, settings, states, repetitions, record, complex_states) + (False,)
        if entry.state == "seen":
            resolved = self._resolve_entry(entry, p, args, leaves, settings, states, repetitions, record,
                                           complex_states, dtype)
            if resolved is not None:
                return resolved
        program, windings = self._walk(args, settings, states, repetitions, record, complex_states)
        return program, values_of(program), windings, False

    def _resolve_entry(self, entry, p, args, leaves, settings, states, repetitions, record, complex_states, dtype):
        """Second sight of a structure: fit `values = A p + b`, check it, and cache it. None if it fails."""
        if torch._C._functorch.peek_interpreter_stack() is not None:
            return None  # the fit needs autograd, which torch.func transforms forbid: resolve on a later call
        copies = [x.detach().cpu().requires_grad_() for x in leaves]  # the layout and the fit work on the host
        lookup = {id(x): c for x, c in zip(leaves, copies, strict=True)}
        probe = {name: lookup.get(id(value), value) for name, value in args.items()}
        entry.state = "walk"  # unless everything below succeeds
        try:
            with torch.enable_grad():
                program, windings = self._walk(probe, settings, states, repetitions, record, complex_states)
                blocks = values_of(program)
                affine = AffineValues.fit(blocks, copies, p.detach().cpu())
        except Exception:  # a layout that cannot be walked with tensors requiring grad (e.g. .numpy())
            return None
        if affine is None or _structure(program)[:3] != _structure(entry.program)[:3]:
            return None
        same_p = torch.equal(p.detach(), entry.p_ref)
        same_path = program.path == entry.program.path
        if not same_p and same_path and not affine.matches(entry.p_ref, entry.values_ref):
            return None
        entry.program, entry.windings, entry.affine = program, windings, affine
        entry.verified = (not same_p and same_path) or p.numel() == 0
        if not entry.verified and same_path:
            entry.verified = self._matches_elsewhere(entry, copies, probe, settings, states, repetitions, record,
                                                     complex_states)
        entry.p_ref, entry.state, entry.seen = p.detach().clone(), "resolved", _versions(leaves)
        return program, affine(p, dtype, wrap_last=True), windings, True

    def _matches_elsewhere(self, entry, copies, probe, settings, states, repetitions, record,
                           complex_states) -> bool:
        """Whether the map just fitted at one protocol point also gives the values walked at a second one
        (`_second_point`): a map seen at two points needs no comparison of a later call's protocol with the
        first, which on a GPU waits for the card on every call. False where the walk there fails or differs:
        the map then stays checked against the first point, as before (`_verify`)."""
        if not all(c.is_floating_point() or c.is_complex() for c in copies):
            return False  # no second point of a count or a mask
        moved_copies = {id(c): _second_point(c.detach()) for c in copies}
        moved = {name: moved_copies.get(id(value), value) for name, value in probe.items()}
        point = _protocol_vector(list(moved_copies.values()), None)
        try:
            with warnings.catch_warnings():  # the user's point warns for itself; this one is the library's
                warnings.simplefilter("ignore")
                return self._walk_against(entry, point, moved, settings, states, repetitions, record,
                                          complex_states)[3]
        except Exception:  # a layout that refuses the moved protocol (a duration past its limit, say)
            return False

    def _verify(self, entry, p, args, settings, states, repetitions, record, complex_states):
        """A resolved map seen only at one protocol point: walk once at a new point and compare."""
        program, values, windings, agrees = self._walk_against(entry, p, args, settings, states, repetitions,
                                                               record, complex_states)
        if agrees:
            entry.verified = True
        else:
            entry.state = "walk"
        return program, values, windings

    def _walk_against(self, entry, p, args, settings, states, repetitions, record, complex_states):
        """(program, values, windings) walked at the protocol `args` (whose vector is `p`), and whether the
        entry's map gives those values there."""
        complex_path = complex_states or entry.program.path == nat.PATH_COMPLEX
        program, windings = self._walk(args, settings, states, repetitions, record, complex_path)
        values = values_of(program)
        agrees = _structure(program)[:4] == _structure(entry.program)[:4] and entry.affine.matches(p, values)
        return program, values, windings, agrees

    def _rotated(self, program, args):
        """`program` with `post_rotation_rad` taken off its ADC demodulation phases (not for stored streams)."""
        rotation = self.post_rotation_rad
        if not rotation or args is None:
            return program
        recording = torch.from_numpy((program.action & nat.RECORD) != 0)
        program.phase_rad = program.phase_rad - rotation * recording.to(torch.float64)
        return program

    def _layout_args(self, protocol: dict):
        """(layout kwargs, structure key parts, protocol leaf tensors) of a converted protocol."""
        args, key, leaves = {}, [], []
        structural = self.structural
        for name, value in protocol.items():
            if isinstance(value, torch.Tensor) and name not in structural:
                key.append((name, tuple(value.shape), value.device))
                leaves.append(value)
            elif isinstance(value, (int, float, bool, str, type(None))):
                key.append((name, type(value), value))
            else:
                try:
                    key.append((name, _hashable(value)))
                except TypeError:
                    key.append((name, id(value)))
            args[name] = value
        self._check_required(args)
        return args, key, leaves

    def _walk(self, args, settings, states, repetitions, record, complex_states):
        """Lay out (or take the stored description) and compile: (program, windings per repetition)."""
        description = self._stored if args is None else self._compose(on_host(args), settings)
        return self._compiled(description, args, states, repetitions, record, complex_states,
                              self._setting(settings, "across_slice"))

    def _compiled(self, description, args, states, repetitions, record, complex_states, across_slice=None):
        """`description` compiled for a call: (program, windings per repetition, for 'auto' only)."""
        if repetitions == "auto":  # one playing; the orders for many
            program = compile_program(description, record=record, states=states or 1, complex_states=complex_states,
                                      slice_profile=across_slice)
            if states is None:
                program.num_states = max(8, min(64, 1 + (1 << 20) * windings(program)))
            return self._rotated(program, args), windings(program)
        program = compile_program(description, repetitions=repetitions, record=record, states=states,
                                  complex_states=complex_states, slice_profile=across_slice)
        return self._rotated(program, args), None

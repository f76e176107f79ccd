"""Gradient waveforms of a Pulseq file and where they take k-space.

The reader needs k-space for one thing: to place each readout at the sample where the axes it sweeps
come closest to k = 0, and to tell which readout positions reach the centre of k-space at all. So k
here is `k(t) = int g dt` (1/m, with g in Hz/m), from 0 at the start of the scan, set back to 0 at the
centre of an excitation and negated at the centre of a refocusing pulse (the rules of pypulseq's
`calculate_kspace`).

Every gradient is a piecewise-linear waveform of its block's time (s from the block start):
* a trapezoid rises from 0 at `delay`, holds `amplitude` for `flat`, falls back to 0;
* an arbitrary gradient on the raster (time shape 0) has its samples at (i + 1/2) rasters after its
  delay, from `first` at the delay to `last` one raster per sample later (1.4 files give neither: the
  waveform is carried on linearly past its end samples, as pypulseq does for `last`);
* time shape -1 puts sample i at (i + 1) half-rasters, from `first` at 0 to `last` at (n + 1) halves;
* any other time shape gives the times (in gradient rasters) of the samples themselves.

The k of every block start comes from one pass of cumulative sums over the whole scan (no loop over
blocks): with a refocusing sign `s` per block, `Q_b k_b` is a running sum that restarts at each
excitation, where `Q_b` is the product of the signs before block b.
"""

from __future__ import annotations

import numpy as np

from ._pulseq_file import PulseqFile, unique_rows

__all__ = ["GradientLibrary", "block_start_k", "readout_positions"]

#: Relative sweep (of the largest |k| change over a readout) below which a readout does not sweep an axis.
SWEEP_RTOL = 1e-9
#: k (1/m) to which block-start k is rounded to find readouts that start at the same point: far below the
#: 1e-6 1/m of the echo test.
K_QUANTUM = 1e-8
#: Samples x positions evaluated at once when placing readouts (bounds the memory of one step).
CHUNK = 1 << 20


class GradientLibrary:
    """Every gradient of the file ([TRAP] and [GRADIENTS] rows) as a piecewise-linear waveform."""

    def __init__(self, file: PulseqFile, grad_raster_s: float) -> None:
        self._file, self._raster = file, grad_raster_s
        traps, arbitrary = file.tables.get("TRAP"), file.tables.get("GRADIENTS")
        self.ids = np.concatenate([t.ids for t in (traps, arbitrary) if t is not None] or [np.zeros(0, np.int64)])
        self._order = np.argsort(self.ids)
        self._waveforms: dict = {}
        n_traps = 0 if traps is None else traps.ids.size
        self.area = np.zeros(self.ids.size)
        self.end_s = np.zeros(self.ids.size)
        self.first_line = np.zeros(self.ids.size, dtype=np.int64)
        if traps is not None:
            amplitude = traps.column("amplitude_hz_per_m")
            rise, flat, fall, delay = (traps.column(c) * 1e-6 for c in ("rise_us", "flat_us", "fall_us", "delay_us"))
            if (np.minimum.reduce([rise, flat, fall, delay]) < 0).any():
                row = int(np.flatnonzero(np.minimum.reduce([rise, flat, fall, delay]) < 0)[0])
                raise ValueError(f"[TRAP] line {traps.lines[row]}: rise, flat, fall and delay must be >= 0 us")
            self.area[:n_traps] = amplitude * (rise / 2 + flat + fall / 2)
            self.end_s[:n_traps] = delay + rise + flat + fall
            self.first_line[:n_traps] = traps.lines
            self._trap = (amplitude, rise, flat, fall, delay)
        if arbitrary is not None:
            for row in range(arbitrary.ids.size):
                t, g = self._arbitrary(arbitrary, row)
                at = n_traps + row
                self._waveforms[at] = (t, g, _cumulative(t, g))
                self.area[at] = self._waveforms[at][2][-1]
                self.end_s[at] = t[-1]
                self.first_line[at] = arbitrary.lines[row]

    def _arbitrary(self, table, row: int) -> tuple[np.ndarray, np.ndarray]:
        gradient_id, line = int(table.ids[row]), int(table.lines[row])
        user = f"[GRADIENTS] line {line} (gradient {gradient_id})"
        amplitude = table.values[row, table.columns.index("amplitude_hz_per_m")]
        delay = table.values[row, table.columns.index("delay_us")] * 1e-6
        if delay < 0:
            raise ValueError(f"{user}: delay must be >= 0 us, got {delay * 1e6}")
        samples = amplitude * self._file.shape(table.values[row, table.columns.index("shape_id")], user=user)
        time_id = int(table.values[row, table.columns.index("time_id")])
        n, r = samples.size, self._raster
        has_ends = "first_hz_per_m" in table.columns
        if has_ends:
            first = table.values[row, table.columns.index("first_hz_per_m")]
            last = table.values[row, table.columns.index("last_hz_per_m")]
        else:  # 1.4: the waveform carried on linearly past its end samples
            first = samples[0] if n == 1 else 1.5 * samples[0] - 0.5 * samples[1]
            last = samples[-1] if n == 1 else 1.5 * samples[-1] - 0.5 * samples[-2]
        if time_id == 0:
            t = np.concatenate([[0.0], (np.arange(n) + 0.5) * r, [n * r]])
            g = np.concatenate([[first], samples, [last]])
        elif time_id == -1:
            t = np.concatenate([[0.0], (np.arange(n) + 1.0) * (r / 2), [(n + 1) * (r / 2)]])
            g = np.concatenate([[first], samples, [last]])
        else:
            t = self._file.shape(time_id, user=user) * r
            if t.size != n:
                raise ValueError(f"{user}: its time shape {time_id} has {t.size} samples, its waveform {n}")
            if np.any(np.diff(t) < 0) or t[0] < 0:
                raise ValueError(f"{user}: the times of time shape {time_id} must start at >= 0 and never decrease")
            g = samples
        return t + delay, g

    def _rows(self, ids: np.ndarray) -> np.ndarray:
        """Row of each gradient id; -1 for id 0 (no gradient). Every id != 0 is known (the file checked it)."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.ids.size == 0:
            return np.full(ids.shape, -1)
        at = self._order[np.minimum(np.searchsorted(self.ids[self._order], ids), self.ids.size - 1)]
        return np.where(ids == 0, -1, at)

    def areas(self, ids: np.ndarray) -> np.ndarray:
        rows = self._rows(ids)
        return np.where(rows >= 0, self.area[np.maximum(rows, 0)] if self.area.size else 0.0, 0.0)

    def ends(self, ids: np.ndarray) -> np.ndarray:
        rows = self._rows(ids)
        return np.where(rows >= 0, self.end_s[np.maximum(rows, 0)] if self.end_s.size else 0.0, 0.0)

    def evaluate(self, ids: np.ndarray, times_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(integral from the block start to t, value at t) of gradient `ids[i]` at `times_s[i]` (s from
        its block's start); 0 for id 0."""
        ids, times_s = np.broadcast_arrays(np.asarray(ids, dtype=np.int64), np.asarray(times_s, dtype=np.float64))
        rows = self._rows(ids)
        integral, value = np.zeros(ids.shape), np.zeros(ids.shape)
        for row in np.unique(rows[rows >= 0]):
            where = rows == row
            integral[where], value[where] = self._evaluate_row(int(row), times_s[where])
        return integral, value

    def _evaluate_row(self, row: int, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if row not in self._waveforms:  # a trapezoid: its four corners
            amplitude, rise, flat, fall, delay = (v[row] for v in self._trap)
            knots = np.array([delay, delay + rise, delay + rise + flat, delay + rise + flat + fall])
            values = np.array([0.0, amplitude, amplitude, 0.0])
            self._waveforms[row] = (knots, values, _cumulative(knots, values))
        knots, values, cumulative = self._waveforms[row]
        j = np.clip(np.searchsorted(knots, t, side="right") - 1, 0, max(knots.size - 2, 0))
        if knots.size == 1:
            return np.zeros(t.shape), np.zeros(t.shape)
        span = knots[j + 1] - knots[j]
        slope = np.divide(values[j + 1] - values[j], span, out=np.zeros(t.shape), where=span > 0)
        dt = np.clip(t - knots[j], 0.0, span)
        integral = cumulative[j] + values[j] * dt + 0.5 * slope * dt * dt
        inside = (t >= knots[0]) & (t <= knots[-1])
        return np.where(t < knots[0], 0.0, integral), np.where(inside, values[j] + slope * dt, 0.0)


def _cumulative(t: np.ndarray, g: np.ndarray) -> np.ndarray:
    """The integral of the piecewise-linear waveform from its first knot to each knot."""
    return np.concatenate([[0.0], np.cumsum(0.5 * (g[1:] + g[:-1]) * np.diff(t))])


def block_start_k(areas: np.ndarray, before_rf: np.ndarray, sign: np.ndarray) -> np.ndarray:
    """k (1/m) at the start of every block, (N, 3).

    `areas` (N, 3) is each block's gradient area, `before_rf` (N, 3) its area up to its pulse's centre
    (0 without a pulse), `sign` (N,) 0 for an excitation, -1 for a refocusing pulse, else 1. Block j
    takes `k -> s (k + a) + (A - a)`; with `Q_b` the product of the signs (excitations counted as 1)
    before block b, `Q_b k_b` is a running sum that an excitation restarts.
    """
    n = areas.shape[0]
    excitation = sign == 0
    flips = np.where(sign < 0, -1.0, 1.0)
    q_after = np.cumprod(flips)  # Q_{j+1}
    q_at = np.concatenate([[1.0], q_after[:-1]])  # Q_j
    step = np.where(excitation[:, None], areas - before_rf, flips[:, None] * before_rf + areas - before_rf)
    totals = np.concatenate([np.zeros((1, 3)), np.cumsum(q_after[:, None] * step, axis=0)])  # P_0 .. P_N
    last = np.maximum.accumulate(np.where(excitation, np.arange(n), -1))
    restart = np.concatenate([[-1], last[:-1]])  # the last excitation before block b
    base = np.where(restart[:, None] >= 0, totals[np.maximum(restart, 0)], 0.0)
    return q_at[:, None] * (totals[:n] - base)


def readout_positions(library: GradientLibrary, gradient_ids: np.ndarray, num: np.ndarray, dwell_s: np.ndarray,
                      delay_s: np.ndarray, k_start: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Where each readout comes closest to k = 0.

    For readout m (gradient ids (3,), `num` samples `dwell_s` apart from `delay_s` after its block
    start, block-start k `k_start` (3,)), sample i sits at `delay + (i + 1/2) dwell`. Returns
    `(c, k_at_c, peak)`: c (M,), the position in dwells from the readout's start (between sample centres,
    linearly interpolated) where the axes the readout sweeps come closest to 0 (its first sample when it
    sweeps none); |k| (all three axes) there; and the largest |k| of any sample.
    """
    m = gradient_ids.shape[0]
    c, k_at_c, peak = np.zeros(m), np.zeros(m), 0.0
    if m == 0:
        return c, k_at_c, peak
    keys = np.column_stack([gradient_ids, num, np.round(dwell_s * 1e12), np.round(delay_s * 1e12)])
    combos, combo_of = unique_rows(keys)
    for u in range(combos.shape[0]):
        members = np.flatnonzero(combo_of == u)
        first = members[0]
        n = int(num[first])
        times = delay_s[first] + (np.arange(n) + 0.5) * dwell_s[first]
        relative = np.stack([library.evaluate(np.full(n, gradient_ids[first, a]), times)[0] for a in range(3)], axis=1)
        sweep = np.ptp(relative, axis=0)
        swept = sweep > SWEEP_RTOL * (1.0 + np.abs(relative).max())
        starts, start_of = unique_rows(np.round(k_start[members] / K_QUANTUM))
        starts = starts * K_QUANTUM
        positions, magnitudes = np.zeros(starts.shape[0]), np.zeros(starts.shape[0])
        rows = max(1, CHUNK // max(n, 1))
        for lo in range(0, starts.shape[0], rows):
            k = starts[lo:lo + rows, None, :] + relative[None, :, :]  # (chunk, n, 3)
            peak = max(peak, float(np.sqrt((k * k).sum(axis=2).max())))
            positions[lo:lo + rows] = _closest(k[:, :, swept]) + 0.5
            x = positions[lo:lo + rows] - 0.5
            i0 = np.clip(np.floor(x).astype(np.int64), 0, max(n - 2, 0))
            i1 = np.minimum(i0 + 1, n - 1)
            fraction = (x - i0)[:, None]
            chunk = np.arange(k.shape[0])
            at = k[chunk, i0] + fraction * (k[chunk, i1] - k[chunk, i0])
            magnitudes[lo:lo + rows] = np.sqrt((at * at).sum(axis=1))
        c[members], k_at_c[members] = positions[start_of], magnitudes[start_of]
    return c, k_at_c, peak


def _closest(k: np.ndarray) -> np.ndarray:
    """For each row of `k` (rows, n, axes), the fractional sample index (0 .. n-1) of the point of its
    polyline through the n samples closest to the origin; 0 when there are no axes."""
    rows, n = k.shape[:2]
    if k.shape[2] == 0 or n == 1:
        return np.zeros(rows)
    d2 = (k * k).sum(axis=2)
    best = d2.argmin(axis=1)
    r = np.arange(rows)
    here = k[r, best]
    result = best.astype(np.float64)
    best_d2 = d2[r, best]
    for step in (1, -1):
        other = best + step
        valid = (other >= 0) & (other < n)
        toward = k[r, np.clip(other, 0, n - 1)] - here
        length2 = (toward * toward).sum(axis=1)
        s = np.clip(np.divide(-(here * toward).sum(axis=1), length2, out=np.zeros(rows), where=length2 > 0), 0, 1)
        point = here + s[:, None] * toward
        d2_here = (point * point).sum(axis=1)
        better = valid & (d2_here < best_d2)
        result = np.where(better, best + step * s, result)
        best_d2 = np.where(better, d2_here, best_d2)
    return result

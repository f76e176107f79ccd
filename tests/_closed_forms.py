"""Closed-form and textbook references for the tests, in float64, each written from its paper.

The simulators' closed forms (blochsim.simulators._formulas), the event-train simulators and the reference
engine are held to these, so nothing here imports blochsim: a formula shared by the code and its test would
check nothing. Where a closed form is a steady state, a second route to it (a recursion played until the
transient has gone) is here too, and the tests use one or the other.

Units: times in ms, frequencies in Hz, fields in T, b-values in s/mm^2, diffusivities in um^2/ms; angles in
degrees or radians as each argument's name says. Functions whose docstring says "broadcasts" take NumPy
arrays (or tensors, converted to float64) for their tissue arguments; the others take Python numbers.
"""

from __future__ import annotations

import cmath
import math

import numpy as np
from scipy.integrate import quad

DEG = math.pi / 180.0

#: The proton's gyromagnetic ratio / 2 pi (CODATA 2018: 42.577478518 MHz/T, rounded as the project spec does).
GAMMA_BAR_HZ_PER_T = 42.577478e6


def _f64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


# -- gradient echo --------------------------------------------------------------------------------------------
def ernst(flip_rad, tr_ms, t1_ms) -> float:
    """The spoiled gradient-echo steady state just after the pulse, in units of M0 (Ernst & Anderson, Rev Sci
    Instrum 1966;37:93): sin(a) (1 - E1) / (1 - E1 cos a), E1 = e^{-TR/T1}."""
    e1 = math.exp(-tr_ms / t1_ms)
    return (1 - e1) * math.sin(flip_rad) / (1 - e1 * math.cos(flip_rad))


def water_fat(te_ms, *, peaks, fat_fraction, fat_phase_deg, b0_hz, t2s_ms, fat_t2s_ms, field_t, water=None,
              fat=None) -> complex:
    """The multi-peak water-fat signal at one echo time, summed peak by peak (Yu et al., MRM 2008;60:1122):

        (W e^{-TE/T2*} + F e^{i phase} e^{-TE/T2*_fat} sum_p a_p e^{i 2 pi f_p TE} / sum_p a_p) e^{-i 2 pi B0 TE},

    f_p = ppm_p 1e-6 GAMMA_BAR field. `peaks` = (ppm, amplitude) of the fat peaks relative to water (a fat
    spectrum table's first two fields). W = 1 - fat_fraction and F = fat_fraction unless `water`, `fat` give them.
    """
    ppm, amplitude = peaks[0], peaks[1]
    water = 1 - fat_fraction if water is None else water
    fat = fat_fraction if fat is None else fat
    t_s = te_ms * 1e-3
    spectrum = sum(a * cmath.exp(2j * math.pi * p * 1e-6 * GAMMA_BAR_HZ_PER_T * field_t * t_s)
                   for p, a in zip(ppm, amplitude, strict=True)) / sum(amplitude)
    fat_signal = fat * cmath.exp(1j * fat_phase_deg * DEG) * math.exp(-te_ms / fat_t2s_ms) * spectrum
    return (water * math.exp(-te_ms / t2s_ms) + fat_signal) * cmath.exp(-2j * math.pi * b0_hz * t_s)


# -- balanced SSFP, IR-TrueFISP, HSFP ------------------------------------------------------------------------
def freeman_hill(flip_rad, tr_ms, t1_ms, t2_ms) -> float:
    """|M| just after each pulse of phase-alternated bSSFP on resonance, in units of M0 (Freeman & Hill, J Magn
    Reson 1971;4:366): sin(a) (1 - E1) / (1 - (E1 - E2) cos a - E1 E2)."""
    e1, e2 = math.exp(-tr_ms / t1_ms), math.exp(-tr_ms / t2_ms)
    return math.sin(flip_rad) * (1 - e1) / (1 - (e1 - e2) * math.cos(flip_rad) - e1 * e2)


def bssfp_fixed_point(flip_deg, tr_ms, te_ms, t1_ms, t2_ms, b0_hz, chemshift_hz, phase_inc_deg) -> complex:
    """-F+ at TE of bSSFP's steady state M = Rx(a) (E P M + (1 - E1) z), solved as a 3x3 linear system.

    P turns the transverse magnetization by F+ -> F+ e^{-i psi} per TR: psi = 2 pi (B0 - chemshift) TR (API.md
    1.6, the chemical shift with the opposite sign) plus phase_inc, the step into the next pulse's phase frame in
    which the sample is demodulated. -F+ is +i|M| on resonance with phase_inc = 180 (API.md 1.6).
    """
    a = flip_deg * DEG
    psi = 2 * math.pi * (b0_hz - chemshift_hz) * tr_ms * 1e-3 + phase_inc_deg * DEG
    rx = np.array([[1, 0, 0], [0, math.cos(a), -math.sin(a)], [0, math.sin(a), math.cos(a)]])
    precess = np.array([[math.cos(psi), math.sin(psi), 0], [-math.sin(psi), math.cos(psi), 0], [0, 0, 1]])
    e1, e2 = math.exp(-tr_ms / t1_ms), math.exp(-tr_ms / t2_ms)
    m = np.linalg.solve(np.eye(3) - rx @ np.diag([e2, e2, e1]) @ precess, rx @ np.array([0, 0, 1 - e1]))
    turn = cmath.exp(-2j * math.pi * (b0_hz - chemshift_hz) * te_ms * 1e-3)
    return -complex(m[0], m[1]) * math.exp(-te_ms / t2_ms) * turn


def ir_truefisp(flip_rad, ti_ms, t1_ms, t2_ms, efficiency) -> float:
    """IR-TrueFISP in units of M0 (Schmitt et al., MRM 2004;51:661): S(TI) = S_ss - (S_ss + eff S_0) e^{-TI/T1*},
    S_ss = sin a / ((T1/T2 + 1) - cos a (T1/T2 - 1)), S_0 = sin(a/2), 1/T1* = cos^2(a/2)/T1 + sin^2(a/2)/T2."""
    ratio = t1_ms / t2_ms
    steady = math.sin(flip_rad) / ((ratio + 1) - math.cos(flip_rad) * (ratio - 1))
    t1_star = 1 / (math.cos(flip_rad / 2) ** 2 / t1_ms + math.sin(flip_rad / 2) ** 2 / t2_ms)
    return steady - (steady + efficiency * math.sin(flip_rad / 2)) * math.exp(-ti_ms / t1_star)


def hsfp_periodic_state(flips_deg, tr_ms, t1_ms, t2_ms, beta, passes) -> list:
    """The samples sin(a_n) r_n of the last of `passes` passes of a hybrid-state free precession train (Asslander
    et al., Commun Phys 2019;2:73), from r = 1, in units of M0. Per TR the radial magnetization relaxes exactly,
    dr/dt = -(sin^2(a)/T2 + cos^2(a)/T1) r + cos(a)/T1; after each pass r -> beta r. The pass map contracts by
    |beta| e^{-sum TR R_n}: the caller states how many passes reach its tolerance."""
    r = 1.0
    for _ in range(passes):
        samples = []
        for flip in flips_deg:
            a = flip * DEG
            rate = math.sin(a) ** 2 / t2_ms + math.cos(a) ** 2 / t1_ms
            decay = math.exp(-tr_ms * rate)
            r = decay * r + math.cos(a) / t1_ms / rate * (1 - decay)
            samples.append(r * math.sin(a))
        r = beta * r
    return samples


# -- Look-Locker, MOLLI, MPRAGE, MP2RAGE, spoiled trains -----------------------------------------------------
def look_locker_mz(mz, flip_rad, tr_ms, t1_ms, count) -> tuple[list, float]:
    """Mz just before each of `count` pulses TR apart, ideally spoiled, from Mz = `mz` before the first (Look &
    Locker, Rev Sci Instrum 1970;41:250): per TR, Mz -> Mz cos(a) E1 + 1 - E1. Returns those and Mz a TR after
    the last pulse."""
    e1, before = math.exp(-tr_ms / t1_ms), []
    for _ in range(count):
        before.append(mz)
        mz = mz * math.cos(flip_rad) * e1 + (1 - e1)
    return before, mz


def look_locker_continuous(flip_rad, tr_ms, ti_ms, t1_ms, efficiency) -> float:
    """Mz times sin(a) at TI after an inversion under a continuous Look-Locker readout, in units of M0 (Deichmann &
    Haase, J Magn Reson 1992;96:608): the pulses act as a rate -ln(cos a)/TR, so Mz relaxes with
    1/T1* = 1/T1 - ln(cos a)/TR towards A = T1*/T1: (A - (A + eff) e^{-TI/T1*}) sin(a)."""
    t1_star = 1 / (1 / t1_ms - math.log(math.cos(flip_rad)) / tr_ms)
    amplitude = t1_star / t1_ms
    return (amplitude - (amplitude + efficiency) * math.exp(-ti_ms / t1_star)) * math.sin(flip_rad)


def molli_mz(flip_rad, tr_ms, readouts, recovery_ms, t1_ms, efficiency) -> list:
    """Mz just before each readout pulse of MOLLI (Messroghli et al., MRM 2004;52:141), from equilibrium: per block
    an inversion (Mz -> -eff Mz), then `readouts[b]` Look-Locker pulses TR apart; `recovery_ms` of free recovery
    before each block after the first."""
    mz, out = 1.0, []
    for b, n in enumerate(readouts):
        if b:
            mz = 1 - (1 - mz) * math.exp(-recovery_ms / t1_ms)
        block, mz = look_locker_mz(-efficiency * mz, flip_rad, tr_ms, t1_ms, n)
        out += block
    return out


def spoiled_train(flips_deg, tr_ms, lead_ms, *, t1, b1=1.0, m0=1.0, efficiency=1.0) -> np.ndarray:
    """The samples of an inversion-prepared, ideally spoiled train, shot by shot: an inversion (Mz -> -eff Mz;
    efficiency -1 for none) at 0, `lead_ms` of recovery, then per shot k the sample M0 sin(a_k) Mz, Mz -> Mz cos(a_k)
    and TR_k of recovery, a_k = B1 flip_k. `tr_ms` is one TR or one per shot. Broadcasts over t1, b1, m0 and
    efficiency; the shots on the last axis."""
    t1, b1, m0, efficiency = (_f64(x) for x in (t1, b1, m0, efficiency))
    tr_ms = np.broadcast_to(_f64(tr_ms), (len(flips_deg),))
    mz = 1 - (1 + efficiency) * np.exp(-lead_ms / t1)
    out = []
    for a, tr in zip(flips_deg, tr_ms, strict=True):
        out.append(m0 * np.sin(a * DEG * b1) * mz)
        e1 = np.exp(-tr / t1)
        mz = mz * np.cos(a * DEG * b1) * e1 + 1 - e1
    return np.stack(np.broadcast_arrays(*out), -1)


def mprage_centre(ti_ms, flip_deg, tr_ms, before, *, t1, m0, efficiency) -> np.ndarray:
    """The centre shot of MPRAGE from equilibrium (Deichmann et al., MRM 2000;44:479): after the inversion and
    `before` shots, Mz = Mss + (Mz0 - Mss) q^before with q = E1 cos a, Mss = (1 - E1) / (1 - q),
    Mz0 = 1 - (1 + eff) e^{-T/T1}, T = TI - before TR the time from the inversion to the first shot; the sample is
    M0 sin(a) Mz. Broadcasts over t1, m0 and efficiency."""
    t1, m0, efficiency = (_f64(x) for x in (t1, m0, efficiency))
    a, e1 = flip_deg * DEG, np.exp(-tr_ms / t1)
    q = e1 * np.cos(a)
    mss = (1 - e1) / (1 - q)
    mz0 = 1 - (1 + efficiency) * np.exp(-(ti_ms - before * tr_ms) / t1)
    return m0 * np.sin(a) * (mss + (mz0 - mss) * q**before)


def mprage_steady_centre_mz(t1_ms, flip_deg, tr_ms, lead_ms, before, after, efficiency) -> np.ndarray:
    """Mz just before the centre pulse of MPRAGE in its steady state: per repetition an inversion, `lead_ms` of
    recovery, `before + after` ideally spoiled shots `tr_ms` apart, the next inversion a TR after the last shot.
    Each stretch is affine in Mz (Mz -> a Mz + b), composed in float64; the steady state is the fixed point
    b / (1 - a) of the whole repetition. Broadcasts over t1_ms."""
    t1_ms = _f64(t1_ms)
    e1, el = np.exp(-tr_ms / t1_ms), np.exp(-lead_ms / t1_ms)
    q = e1 * math.cos(flip_deg * DEG)

    def shots(n):  # n shots: Mz -> q^n Mz + (1 - E1)(1 + q + ... + q^{n-1})
        return q**n, (1 - e1) * (1 - q**n) / (1 - q)

    def then(first, second):
        return second[0] * first[0], second[0] * first[1] + second[1]

    to_centre = then(then((-efficiency, np.zeros_like(t1_ms)), (el, 1 - el)), shots(before))
    whole = then(to_centre, shots(after))
    start = whole[1] / (1 - whole[0])
    return to_centre[0] * start + to_centre[1]


def mp2rage_signal_equation(ti_ms, flips_deg, tr_ms, tr_mp2rage_ms, before, after, t1, efficiency) -> np.ndarray:
    """(GRE1, GRE2) of MP2RAGE in its steady state, in units of M0 (Marques et al., NeuroImage 2010;49:1271,
    appendix): the steady-state Mz before the inversion, GRE1 forward from the inversion, GRE2 backward from the
    end of the cycle; generalised from n/2 to `before` shots before the sampled one and `after` from it. Block k's
    sampled shot is at TI[k]. Broadcasts over t1 and efficiency; (GRE1, GRE2) on the last axis."""
    t1, efficiency = _f64(t1), _f64(efficiency)
    n = before + after
    e1 = np.exp(-tr_ms / t1)
    ta, tb, tc = ti_ms[0] - before * tr_ms, ti_ms[1] - ti_ms[0] - n * tr_ms, tr_mp2rage_ms - ti_ms[1] - after * tr_ms
    ea, eb, ec = (np.exp(-x / t1) for x in (ta, tb, tc))
    c1, c2 = math.cos(flips_deg[0] * DEG), math.cos(flips_deg[1] * DEG)
    q1, q2 = c1 * e1, c2 * e1
    chain = (((1 - ea) * q1**n + (1 - e1) * (1 - q1**n) / (1 - q1)) * eb + (1 - eb)) * q2**n
    chain = (chain + (1 - e1) * (1 - q2**n) / (1 - q2)) * ec + (1 - ec)
    mz_ss = chain / (1 + efficiency * (c1 * c2) ** n * np.exp(-tr_mp2rage_ms / t1))
    gre1 = (-efficiency * mz_ss * ea + (1 - ea)) * q1**before + (1 - e1) * (1 - q1**before) / (1 - q1)
    gre2 = (mz_ss - (1 - ec)) / (ec * q2**after) - (1 - e1) * (q2 ** (-after) - 1) / (1 - q2)
    return np.stack(np.broadcast_arrays(math.sin(flips_deg[0] * DEG) * gre1, math.sin(flips_deg[1] * DEG) * gre2), -1)


def mp2rage_shot_by_shot(ti_ms, flips_deg, tr_ms, tr_mp2rage_ms, before, after, t1_ms, efficiency, cycles) -> list:
    """(GRE1, GRE2) of MP2RAGE by playing the Mz recursion shot by shot for `cycles` inversion cycles from
    equilibrium, in units of M0: the last cycle's sampled values. Block k's sampled shot (after `before` shots)
    is at TI[k]. The cycle map contracts by eff e^{-TRmp2rage/T1}: the caller states how many cycles it needs."""
    relax = lambda mz, dt: 1 - (1 - mz) * math.exp(-dt / t1_ms)  # noqa: E731
    mz = 1.0
    for _ in range(cycles):
        mz, t, samples = -efficiency * mz, 0.0, []
        for k in range(2):
            first = ti_ms[k] - before * tr_ms
            mz = relax(mz, first - t)
            for j in range(before + after):
                if j == before:
                    samples.append(math.sin(flips_deg[k] * DEG) * mz)
                mz = relax(mz * math.cos(flips_deg[k] * DEG), tr_ms)
            t = first + (before + after) * tr_ms
        mz = relax(mz, tr_mp2rage_ms - t)
    return samples


# -- spin echoes ------------------------------------------------------------------------------------------------
def spin_echo(te_ms, tr_ms, t1_ms, t2_ms) -> float:
    """A 90-180 spin echo repeated every TR, in units of M0: (1 - 2 e^{-(TR - TE/2)/T1} + e^{-TR/T1}) e^{-TE/T2}
    (the 90 leaves Mz = 0; the 180 at TE/2 inverts what recovered; TR - TE/2 more recovery before the next 90)."""
    return (1 - 2 * math.exp(-(tr_ms - te_ms / 2) / t1_ms) + math.exp(-tr_ms / t1_ms)) * math.exp(-te_ms / t2_ms)


def stimulated_echoes(flips_deg, te_ms, tm_ms, *, t1, t2, b1=1.0, m0=1.0) -> np.ndarray:
    """(SE, STE) of three pulses about x (Hahn, Phys Rev 1950;80:580; API.md 5.1), a_k = B1 flip_k:
    SE = i M0 sin a1 sin^2(a2/2) e^{-TE/T2}, STE = i M0 sin a1 sin a2 sin a3 e^{-TE/T2} e^{-TM/T1} / 2.
    Broadcasts over t1, t2, b1 and m0; (SE, STE) on the last axis."""
    t1, t2, b1, m0 = (_f64(x) for x in (t1, t2, b1, m0))
    a1, a2, a3 = (a * DEG * b1 for a in flips_deg)
    se = 1j * m0 * np.sin(a1) * np.sin(a2 / 2) ** 2 * np.exp(-te_ms / t2)
    ste = 1j * m0 * np.sin(a1) * np.sin(a2) * np.sin(a3) * np.exp(-te_ms / t2) * np.exp(-tm_ms / t1) / 2
    return np.stack(np.broadcast_arrays(se, ste), -1)


# -- relaxometry, diffusion, ASL, CEST ---------------------------------------------------------------------------
def inversion_recovery(ti_ms, t1_ms, efficiency, tr_ms=None):
    """Mz at TI after an inversion, in units of M0: 1 - (1 + eff) e^{-TI/T1} from equilibrium; with a repetition
    time TR, the readout at TI saturates and Mz recovers for TR - TI before the next inversion:
    1 - (1 + eff (1 - e^{-(TR - TI)/T1})) e^{-TI/T1}."""
    start = 1.0 if tr_ms is None else 1 - math.exp(-(tr_ms - ti_ms) / t1_ms)
    return 1 - (1 + efficiency * start) * math.exp(-ti_ms / t1_ms)


def diffusion_tensor(b_s_per_mm2, direction, tensor_um2_per_ms) -> float:
    """e^{-b g^T D g / |g|^2} for a gradient direction g (any length, not zero) and a 3x3 diffusion tensor D
    (Basser et al., Biophys J 1994;66:259); um^2/ms is 1e-3 mm^2/s."""
    g = _f64(direction)
    return math.exp(-b_s_per_mm2 * 1e-3 * float(g @ _f64(tensor_um2_per_ms) @ g) / float(g @ g))


def buxton_asl(t_ms, tau_ms, cbf, att_ms, t1_ms, m0, t1_blood_ms, partition, alpha, labelling) -> float:
    """The general kinetic model of ASL (Buxton et al., MRM 1998;40:383), 2 (M0/lambda) f int c(s) r(t - s)
    m(t - s) ds, by adaptive quadrature (relative accuracy ~1e-13): f = CBF in ml/100g/min, c the labelled bolus
    from ATT for tau (alpha e^{-ATT/T1b} continuous, alpha e^{-s/T1b} pulsed), r m = e^{-(t - s)(1/T1 + f/lambda)}."""
    f = cbf / 6000.0 / 1000.0  # ml/100g/min -> ml/g/ms
    upper = min(t_ms, att_ms + tau_ms)
    if upper <= att_ms:
        return 0.0
    if labelling == "continuous":
        bolus = lambda s: alpha * math.exp(-att_ms / t1_blood_ms)  # noqa: E731
    else:
        bolus = lambda s: alpha * math.exp(-s / t1_blood_ms)  # noqa: E731
    integrand = lambda s: bolus(s) * math.exp(-f * (t_ms - s) / partition) * math.exp(-(t_ms - s) / t1_ms)  # noqa: E731
    value, _ = quad(integrand, att_ms, upper, epsabs=0.0, epsrel=1e-13, limit=200)
    return 2 * (m0 / partition) * f * value


def lorentzian_z(offset_ppm, pools, m0=1.0) -> float:
    """A Z-spectrum of Lorentzian lines: M0 (1 - sum_p A_p (W_p/2)^2 / ((W_p/2)^2 + (x - S_p)^2)), `pools` =
    [(amplitude A, full width W in ppm, shift S in ppm)]."""
    dip = sum(a * (w / 2) ** 2 / ((w / 2) ** 2 + (offset_ppm - s) ** 2) for a, w, s in pools)
    return m0 * (1 - dip)

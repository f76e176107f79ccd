/* blochsim C ABI: the only seam between the kernels and Python (ctypes).
 *
 * Conventions
 *   - Every entry point takes one pointer to a plain struct and returns 0 on success; on failure it
 *     returns nonzero and bs_last_error() explains. Nothing throws across this boundary.
 *   - Kernels never allocate outputs: the caller (Python, with torch) allocates every array.
 *   - Real arrays are float32 or float64 as `dtype` says; complex arrays are interleaved (re, im) pairs of
 *     that real type. Shapes are given in the comments as [dims], row-major, contiguous unless a stride is given.
 *   - Tissue values are in public units: T1/T2 in ms, B0 in Hz, B1 a fraction, B1phase in rad,
 *     D in um^2/ms, v in m/s. A null tissue pointer means the identity value (the physics is off).
 *   - `stream` is the CUDA stream (cudaStream_t) for the CUDA build; the host build ignores it.
 *   - `scratch` is device memory of at least bs_epg_scratch_bytes(...) bytes for the CUDA build (Python
 *     allocates it with torch); the host build needs none and ignores it.
 */
#ifndef BLOCHSIM_CAPI_H
#define BLOCHSIM_CAPI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define BS_API __declspec(dllexport)
#else
#define BS_API __attribute__((visibility("default")))
#endif

/* Bumped on every change of a struct below or of an entry point's meaning. */
#define BS_ABI_VERSION 5

enum bs_dtype { BS_FLOAT32 = 0, BS_FLOAT64 = 1 };

enum bs_path { BS_PATH_REAL = 0, BS_PATH_COMPLEX = 1 };

/* Packed action bits of an event (EventAction values plus the kernel-only INTERVAL bit). */
enum bs_action {
  BS_CRUSH_BEFORE = 1,
  BS_CRUSH_AFTER = 2,
  BS_INVERSION = 4,
  BS_SPOIL_AFTER = 8,
  BS_SHIFT_AFTER = 16,
  BS_RECORD = 32,
  BS_ROTATE = 64,   /* any RF pulse but an inversion */
  BS_INTERVAL = 256 /* relax over dt before the event (dt nonzero or differentiated) */
};

/* Tissue properties of pool model 0 (free water), in the order of the arrays below. */
enum bs_tissue_param {
  BS_T1_MS = 0,
  BS_T2_MS,
  BS_M0,
  BS_B1,
  BS_B1_PHASE_RAD,
  BS_B0_HZ,
  BS_INVERSION_EFFICIENCY,
  BS_DIFFUSION_UM2_PER_MS,
  BS_VELOCITY_M_PER_S,
  BS_NUM_TISSUE
};

/* A compiled program: one repetition's events, played num_repetitions times, recorded on the last. */
typedef struct bs_program {
  int64_t num_events;         /* E: events per repetition                                            */
  int64_t num_repetitions;    /* N >= 1: playings; only the last is recorded                         */
  int64_t num_samples;        /* S: recorded samples                                                  */
  int64_t num_states;         /* K >= 1: EPG orders per pool                                          */
  int32_t path;               /* bs_path: real (three real planes) or complex states                  */
  int32_t checkpoint_stride;  /* adjoints keep every stride-th state and replay stretches (>= 1; the
                                 host's real plain path takes ~sqrt(events), whose store is smaller)   */
  const int32_t* action;      /* [E] read: bs_action bits                                             */
  const int32_t* record;      /* [E] read: sample slot (0..S-1) of a recorded ADC, else -1            */
  const void* dt_s;           /* [E] read: interval before each event, s                              */
  const void* dt_wrap_s;      /* [1] read: interval before event 0 on every repetition after the first */
  const void* flip_rad;       /* [E] read: signed flip of RF events (real path: half turns folded in) */
  const void* phase_rad;      /* [E] read: RF phase (rad); for ADC events the demodulation phase       */
  double crusher_dk_rad_per_m; /* dephasing per unit length of one crusher; 0: no crusher geometry     */
  double voxel_size_m;        /* voxel length along the crusher; 0: none (no washout)                 */
  /* Pools. Pool model 0 (free water, closed-form intervals): 1, 1, and no tables. Tabulated layouts:
   * nt water-like pools (free first) with transverse states, nl >= nt longitudinal pools (the last nl - nt
   * semisolid), nl <= 8, and the interval operators read from bs_tables.                               */
  int32_t num_transverse_pools;   /* nt                                                                */
  int32_t num_longitudinal_pools; /* nl                                                                */
  int32_t tabulated;              /* 1: relax with the tables; 0: pool model 0                         */
  int32_t checkpoint_slots;       /* the states a replayed stretch keeps in the adjoints: at
                                     least the events that relax, rotate or invert (action & (ROTATE |
                                     INTERVAL | INVERSION)) within any stretch of checkpoint_stride events,
                                     stretches starting at multiples of it over every repetition's events
                                     (0 <= slots <= stride); 0: one per event                          */
  int64_t num_intervals;          /* D: table rows (distinct intervals)                                 */
  const int32_t* interval;        /* [E] read: table row of each event's interval (any value if none)   */
  int64_t wrap_interval;          /* table row of event 0's interval on repetitions after the first     */
  /* Pulses played per voxel (csrc/include/blochsim/pulses.hpp; complex path only). A null row array: no
   * event reads that table. Voxel v of the call plays at slice position (v + voxel_offset) % num_positions. */
  const int32_t* field_row;       /* [E] read: row of tables.field (the event's transmit field), or -1   */
  const int32_t* profile_row;     /* [E] read: row of tables.profile (a profiled definition), or -1      */
  const int32_t* spinor_row;      /* [E] read: row of tables.spinor (a per-voxel Cayley-Klein pair), or -1 */
  int64_t num_field_rows;         /* F                                                                  */
  int64_t num_spinor_rows;        /* Rs                                                                 */
  int64_t num_profile_rows;       /* Dp                                                                 */
  int64_t num_positions;          /* P >= 1: slice positions                                            */
  int64_t voxel_offset;           /* the call's first voxel within the slice-resolved layout (chunks)   */
  int64_t profile_bins;           /* knots of effective flip over [0, profile_theta_max], >= 2         */
  double profile_theta_max;       /* rad                                                                */
} bs_program;

/* Per-voxel tables: of a tabulated layout (see csrc/include/blochsim/relax_tables.hpp) and of per-voxel
 * pulses (pulses.hpp). Element i of voxel v of a table is at data[v * stride_v + i]; stride_v 0 shares one
 * table among all voxels. As tangents, the tables carry a leading [P] axis with stride stride_p. */
typedef struct bs_tables {
  const void* L;    /* [V|1, D, nl, nl] real: exp(A dt), longitudinal           */
  const void* r;    /* [V|1, D, nl] real: (I - L) Zeq, added to Z(0)            */
  const void* T;    /* [V|1, D, nt, nt] complex: exp(C dt), transverse          */
  const void* zeq;  /* [V|1, nl] real: equilibrium, fractions of M0             */
  const void* sat;  /* [V|1, E] real: S * G(f_rf - B0) of each RF event          */
  /* Per-voxel pulses (pulses.hpp), with or without pool tables: */
  const void* field;    /* [V|1, F, 2] real: transmit field rows, (magnitude, phase rad)                   */
  const void* spinor;   /* [V|1, Rs, 4] real: Cayley-Klein pairs (a, b) at phase 0, (re, im) each           */
  const void* profile;  /* [1, P, Dp, bins, 8] real: (a, b, da/dtheta, db/dtheta) at each knot, shared      */
  int64_t stride_v[8];
  int64_t stride_p[8];
} bs_tables;

/* Per-voxel cotangents of the tables (written; [V, ...] in the shapes above; null: not wanted). */
typedef struct bs_table_grads {
  void* L;
  void* r;
  void* T;
  void* zeq;
  void* sat;
  void* field;
  void* spinor;
  void* profile;  /* always null: the profiles are constants */
} bs_table_grads;

/* Per-voxel tissue: value of property j for voxel v is data[j][v * stride[j]] (stride 0 broadcasts). */
typedef struct bs_tissue {
  int64_t num_voxels;                  /* V                                      */
  const void* data[BS_NUM_TISSUE];     /* [V] read, or null for the identity     */
  int64_t stride[BS_NUM_TISSUE];       /* voxel stride in elements               */
} bs_tissue;

/* P tangent directions on the inputs. Null pointers are zero tangents. */
typedef struct bs_tangents {
  int32_t count;                       /* P                                                    */
  const void* tissue[BS_NUM_TISSUE];   /* [P, V] read with the two strides below               */
  int64_t tissue_stride_p[BS_NUM_TISSUE];
  int64_t tissue_stride_v[BS_NUM_TISSUE];
  const void* dt_s;                    /* [P, E] read */
  const void* dt_wrap_s;               /* [P] read    */
  const void* flip_rad;                /* [P, E] read */
  const void* phase_rad;               /* [P, E] read */
} bs_tangents;

/* Gradients (or their tangents, [P, ...] ahead of the shapes given). Null: not wanted. */
typedef struct bs_grads {
  void* dt_s;                  /* [E] written: summed over voxels */
  void* dt_wrap_s;             /* [1] written                     */
  void* flip_rad;              /* [E] written                     */
  void* phase_rad;             /* [E] written                     */
  void* tissue[BS_NUM_TISSUE]; /* [V] written: per voxel          */
} bs_grads;

/* signal = simulate(program, tissue) */
typedef struct bs_epg_forward_args {
  int32_t dtype;        /* bs_dtype                                   */
  int32_t num_threads;  /* host threads; <= 0: all of the pool        */
  void* stream;
  bs_program program;
  bs_tissue tissue;
  bs_tables tables;
  void* signal;         /* [V, S] complex, written                    */
  void* scratch;         /* device scratch (CUDA build), or null */
  int64_t scratch_bytes;
} bs_epg_forward_args;

/* signal and its P directional derivatives (forward mode, P in 1..8) */
typedef struct bs_epg_jvp_args {
  int32_t dtype;
  int32_t num_threads;
  void* stream;
  bs_program program;
  bs_tissue tissue;
  bs_tables tables;
  bs_tangents tangents;
  bs_tables tables_tangent;
  void* signal;          /* [V, S] complex, written      */
  void* signal_tangent;  /* [P, V, S] complex, written   */
  void* scratch;         /* device scratch (CUDA build), or null */
  int64_t scratch_bytes;
} bs_epg_jvp_args;

/* grads = d<cotangent, signal>/d(inputs), the real part of the complex inner product (adjoint, checkpointed) */
typedef struct bs_epg_vjp_args {
  int32_t dtype;
  int32_t num_threads;
  void* stream;
  bs_program program;
  bs_tissue tissue;
  bs_tables tables;
  const void* cotangent; /* [V, S] complex, read */
  bs_grads grads;
  bs_table_grads table_grads;
  void* scratch;         /* device scratch (CUDA build), or null */
  int64_t scratch_bytes;
} bs_epg_vjp_args;

/* Second-order adjoint: the VJP differentiated along one tangent direction (P = 1), with a tangent on
 * the cotangent too. Writes the VJP (grads), its directional derivative (grads_tangent), and the
 * signal with its tangent (forward mode along the same direction). */
typedef struct bs_epg_vjp_jvp_args {
  int32_t dtype;
  int32_t num_threads;
  void* stream;
  bs_program program;
  bs_tissue tissue;
  bs_tables tables;
  bs_tangents tangents;          /* count must be 1                 */
  bs_tables tables_tangent;
  const void* cotangent;         /* [V, S] complex, read            */
  const void* cotangent_tangent; /* [V, S] complex, read, or null   */
  bs_grads grads;
  bs_grads grads_tangent;
  bs_table_grads table_grads;
  bs_table_grads table_grads_tangent;
  void* signal;                  /* [V, S] complex, written, or null */
  void* signal_tangent;          /* [V, S] complex, written, or null */
  void* scratch;         /* device scratch (CUDA build), or null */
  int64_t scratch_bytes;
} bs_epg_vjp_jvp_args;

BS_API int32_t bs_abi_version(void);
BS_API const char* bs_version(void);     /* the blochsim version the library was built with */
BS_API const char* bs_last_error(void);  /* message of the last failure on this thread      */
/* Host library only: the SIMD lane sets it holds (bits: 1 portable 4 lanes, 2 AVX2, 4 AVX-512; a source
 * build holds its processor's widest), and the set the real plain path runs in this process (0: per voxel;
 * -1: BLOCHSIM_HOST_ISA names no set, see bs_last_error). */
BS_API int32_t bs_host_lane_sets(void);
BS_API int32_t bs_host_lanes_running(void);
BS_API int32_t bs_epg_forward(const bs_epg_forward_args* args);
BS_API int32_t bs_epg_jvp(const bs_epg_jvp_args* args);
BS_API int32_t bs_epg_vjp(const bs_epg_vjp_args* args);
BS_API int32_t bs_epg_vjp_jvp(const bs_epg_vjp_jvp_args* args);
/* Scratch bytes a pass needs (pass: 0 forward, 1 JVP, 2 VJP, 3 VJP-JVP; args: that pass's struct).
 * Returns -1 on invalid arguments (see bs_last_error). The host build returns 0. */
BS_API int64_t bs_epg_scratch_bytes(int32_t pass, const void* args);
/* Voxels the pass's kernel at args' size keeps resident on the current device at once (CUDA build): a
 * launch of more runs in waves of this many. 0 where it cannot tell (and from the host build); -1 on
 * invalid arguments (see bs_last_error). Starts nothing and allocates nothing; args' scratch is not read. */
BS_API int64_t bs_epg_resident_voxels(int32_t pass, const void* args);

#ifdef __cplusplus
}
#endif
#endif

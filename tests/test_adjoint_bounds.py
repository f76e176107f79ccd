"""benchmarks/adjoint_bounds.py's reading of ncu's CSV log and its floors (no card: a log written here)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from adjoint_bounds import METRICS, kernel_counters, summary, top_stalls  # noqa: E402

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def log(kernels: dict) -> str:
    """ncu's --csv log of `kernels` ({id: (name, {metric: value})}), with a note line ncu writes between."""
    lines = ["==PROF== Connected to process 1", HEADER]
    for kid, (name, values) in kernels.items():
        for metric, value in values.items():
            lines.append(f'"{kid}","1","python3","h","{name}(Problem<T6>, long)","1","7","(128, 1, 1)",'
                         f'"(10, 1, 1)","0","9.0","Command line profiler metrics","{metric}","","{value}"')
    return "\n".join(lines)


def counters(ns, read, written, instructions):
    return {"gpu__time_duration.sum": ns, "dram__bytes_read.sum": read, "dram__bytes_write.sum": written,
            "smsp__inst_executed.sum": instructions, "sm__warps_active.avg.pct_of_peak_sustained_active": "50",
            "launch__registers_per_thread": "168", "sm__cycles_elapsed.avg.per_second": "1,000,000,000",
            "launch__sm_count": "100"}


def test_kernel_counters_and_floors():
    text = log({"0": ("void bs::vjp_values_kernel<Dual<float, 1>>", counters("2,000,000", "3e9", "1e9", "8e8")),
                "1": ("void bs::decode_general_events_kernel<float>", counters("1,000", "n/a", "0", "4e5"))})
    kernels = kernel_counters(text)
    assert [k["kernel"] for k in kernels] == ["bs::vjp_values_kernel<Dual<float, 1>>",
                                             "bs::decode_general_events_kernel<float>"]
    assert set(kernels[0]) == {"kernel", *METRICS.values()}
    assert kernels[0]["ns"] == 2e6 and kernels[1]["read"] == 0.0  # (commas dropped; n/a read as none)
    s = summary(kernels, bandwidth=2e12)
    assert s["gpu_ms"] == pytest.approx(2.001)
    assert s["dram_bytes"] == 4e9 and s["byte_floor_ms"] == pytest.approx(2.0)
    # 8e8 + 4e5 warp instructions over 4 schedulers x 100 multiprocessors at 1 GHz
    assert s["issue_floor_ms"] == pytest.approx((8e8 + 4e5) / 4e11 * 1e3)
    assert s["launches"] == 2


def test_stall_counters_are_kept_by_reason_and_ranked():
    stalls = {"smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio": "3.5",
              "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": "0.25",
              "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": "1,2"}
    kernels = kernel_counters(log({"0": ("void bs::vjp_warp_kernel<float>", {**counters("1", "1", "1", "1"),
                                                                             **stalls})}))
    assert kernels[0]["stall_short_scoreboard"] == 3.5 and kernels[0]["stall_wait"] == 12.0
    assert top_stalls(kernels[0], 2) == "wait 12.0, short_scoreboard 3.5"  # (ncu's thousands comma dropped)

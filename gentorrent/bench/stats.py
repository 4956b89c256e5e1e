"""Summaries shared by the benchmarks: percentiles, mean/p50/p99 figures, the CPU's name."""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in 0..100)."""
    if not sorted_values:
        return math.nan
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


_UNITS = {"ms": 1e3, "us": 1e6}


def summarize(prefix: str, seconds: list[float], unit: str = "ms") -> dict[str, float]:
    """``{prefix}_mean_{unit}, _p50_{unit}, _p99_{unit}`` from durations in seconds."""
    s = sorted(seconds)
    k = _UNITS[unit]
    return {
        f"{prefix}_mean_{unit}": k * sum(s) / len(s),
        f"{prefix}_p50_{unit}": k * percentile(s, 50),
        f"{prefix}_p99_{unit}": k * percentile(s, 99),
    }


def summarize_ms(prefix: str, seconds: list[float]) -> dict[str, float]:
    return summarize(prefix, seconds, "ms")


def process_usage(pid: int) -> tuple[float, float]:
    """``(resident MiB, CPU seconds: user + system)`` of process ``pid``, from /proc (Linux);
    ``OSError`` when it is gone."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    rss_kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return rss_kib / 1024.0, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_model() -> str:
    """The processor's model name, for benchmark params."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def overlay_vs_direct(stem: str, overlay: list[float], direct: list[float]) -> dict[str, float]:
    """Mean/p50/p99 of the same request through the overlay and direct (seconds in), plus
    ``{stem}_added_p50_ms`` and ``{stem}_p50_ratio_overlay_vs_direct``."""
    f = summarize_ms(f"{stem}_overlay", overlay)
    f.update(summarize_ms(f"{stem}_direct", direct))
    f[f"{stem}_added_p50_ms"] = f[f"{stem}_overlay_p50_ms"] - f[f"{stem}_direct_p50_ms"]
    f[f"{stem}_p50_ratio_overlay_vs_direct"] = f[f"{stem}_overlay_p50_ms"] / f[f"{stem}_direct_p50_ms"]
    return f

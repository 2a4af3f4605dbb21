"""The hardware's peak FLOP/s for a compute dtype: the denominator of model FLOP utilization.

CPU: cores x FMA units x SIMD lanes x 2 x clock, each input read from this machine where it
can be (`/proc/cpuinfo`, the CPUs this process may run on, `cpufreq`) and named with its
source. The number of FMA pipes per core is not exposed by the machine; it is an argument
(default 2: Intel cores since Haswell, AMD since Zen 2). Where the CPU has an AMX tile unit
for the dtype (`amx_bf16`, `amx_fp16`), its matrix products are the peak instead: cores x
`AMX_FLOPS_PER_CYCLE` x clock. oneDNN, under TensorFlow's and PyTorch's CPU matmuls, runs
bfloat16 products there when it can.

GPU: NVIDIA's published dense (no sparsity) peaks, `GPU_PEAKS`. float32 under TensorFlow
runs matmuls as TF32 on these GPUs unless TF32 execution is turned off, so a float32 policy
is measured against the TF32 peak there.
"""

import dataclasses
import os
import re
from pathlib import Path

# Dense peaks in TFLOP/s from NVIDIA's data sheets (the sparsity figures halved where the
# sheet quotes only those): (name pattern, label, {dtype: TFLOP/s}). First match wins.
GPU_PEAKS = (
    (
        r"H100.*PCIe",
        "H100 PCIe",
        {"float32": 51.0, "tf32": 378.0, "bfloat16": 756.0, "float16": 756.0},
    ),
    (r"H100", "H100 SXM", {"float32": 67.0, "tf32": 494.7, "bfloat16": 989.4, "float16": 989.4}),
    (r"H200", "H200 SXM", {"float32": 67.0, "tf32": 494.7, "bfloat16": 989.4, "float16": 989.4}),
    (r"A100", "A100", {"float32": 19.5, "tf32": 156.0, "bfloat16": 312.0, "float16": 312.0}),
    (r"\bL4\b", "L4", {"float32": 30.3, "tf32": 60.0, "bfloat16": 121.0, "float16": 121.0}),
)
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")

AMX_FLOPS_PER_CYCLE = 1024
"""FLOP per cycle per core of an AMX tile unit for bfloat16 (`amx_bf16`) or float16 (`amx_fp16`).

One TDPBF16PS (TDPFP16PS) multiplies a 16 x 32 tile by a 32 x 16 tile: 16 x 16 x 32 = 8,192
multiply-adds, 16,384 FLOP, and the unit takes one every 16 cycles (Intel's figure for 4th
generation Xeon Scalable: 1,024 bfloat16 operations per cycle per core).
"""
AMX_FLAGS = {"bfloat16": "amx_bf16", "float16": "amx_fp16"}


@dataclasses.dataclass(frozen=True)
class Peak:
    """A peak rate and what it was computed from.

    Attributes:
        flops_per_second: the peak.
        device: e.g. "AMD EPYC (CPU)" or "H100 SXM".
        dtype: the arithmetic it is the peak of ("float32", "tf32", "bfloat16", "float16").
        formula: how it was obtained, with every input, e.g.
            "2 cores x 2 FMA units x 8 float32 lanes x 2 x 2.445 GHz".
        sources: where each input came from.
    """

    flops_per_second: float
    device: str
    dtype: str
    formula: str
    sources: tuple = ()

    def describe(self):
        text = f"{self.device}, {self.dtype}: {self.formula} = {self.flops_per_second / 1e9:,.1f} GFLOP/s"
        return text + "".join(f"\n  {source}" for source in self.sources)


def cpu_peak_flops(cores, fma_units, simd_lanes, clock_hz):
    """cores x FMA units x SIMD lanes x 2 (an FMA is a multiply and an add) x clock."""
    return cores * fma_units * simd_lanes * 2 * clock_hz


def _check_dtype(compute_dtype):
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(
            f"compute_dtype must be one of {COMPUTE_DTYPES}. Received: compute_dtype={compute_dtype!r}"
        )


def simd_lanes(flags, compute_dtype):
    """`(lanes, vector bits, note)`: multiply-adds per FMA instruction for `compute_dtype`.

    The vector width is the widest of AVX-512 (512 bits), AVX/AVX2 (256) and SSE (128) in
    `flags`. bfloat16 doubles the float32 lanes only with AVX512_BF16 (`vdpbf16ps`), float16
    only with AVX512_FP16; otherwise they run as float32 and have its peak.
    """
    _check_dtype(compute_dtype)
    flags = set(flags)
    bits = 512 if "avx512f" in flags else 256 if "avx" in flags else 128
    lanes = bits // 32
    if compute_dtype == "bfloat16" and "avx512_bf16" in flags:
        return 2 * lanes, bits, "avx512_bf16"
    if compute_dtype == "float16" and "avx512_fp16" in flags:
        return 2 * lanes, bits, "avx512_fp16"
    if compute_dtype != "float32":
        return lanes, bits, f"no {compute_dtype} vector arithmetic in the flags: float32 lanes"
    return lanes, bits, ""


ARITHMETIC_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_fp16",
    "amx_int8",
)
"""The `/proc/cpuinfo` flags that decide how fast matrix arithmetic can run, in this order."""


def cpu_flags(cpuinfo=None):
    """The `ARITHMETIC_FLAGS` this machine's CPU has (or the given `/proc/cpuinfo` text's), as one string.

    Printed with every measured result: the CPU model changes between machines of one kind.

    >>> cpu_flags("processor : 0\\nflags : fpu avx2 sse4_2 fma avx\\n")
    'sse4_2 avx avx2 fma'
    """
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        if not path.exists():
            return "unknown (no /proc/cpuinfo)"
        cpuinfo = path.read_text()
    processors = parse_cpuinfo(cpuinfo)
    flags = set(processors[0].get("flags", "").split()) if processors else set()
    return " ".join(flag for flag in ARITHMETIC_FLAGS if flag in flags) or "none"


def _vector_flag(flags):
    return next((flag for flag in ("avx512f", "avx2", "avx", "sse2") if flag in flags), "none")


def parse_cpuinfo(text):
    """`/proc/cpuinfo` as a list of one dict per logical processor."""
    processors, current = [], {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                processors.append(current)
                current = {}
            continue
        key, _, value = line.partition(":")
        current[key.strip()] = value.strip()
    if current:
        processors.append(current)
    return processors


def cpu_peak(
    compute_dtype="float32", fma_units=2, cpuinfo=None, usable_cpus=None, max_frequency_khz=None
):
    """The peak of this machine's CPUs (or of the given `/proc/cpuinfo` text) for `compute_dtype`.

    Args:
        compute_dtype: "float32", "bfloat16" or "float16".
        fma_units: FMA pipes per core (not readable from the machine).
        cpuinfo: `/proc/cpuinfo` text (default: read it).
        usable_cpus: logical CPU ids this process may run on (default: its affinity).
        max_frequency_khz: the maximum clock (default: `cpufreq/cpuinfo_max_freq` of the
            first usable CPU if the kernel exposes it, else the highest `cpu MHz` in
            `/proc/cpuinfo`, the current clock).

    Returns:
        a `Peak`. Cores are the distinct (physical id, core id) pairs of the usable logical
        CPUs: hyper-threads share their core's FMA units.
    """
    _check_dtype(compute_dtype)
    if cpuinfo is None:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    processors = parse_cpuinfo(cpuinfo)
    if usable_cpus is None:
        usable_cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    if usable_cpus is not None:
        processors = [p for p in processors if int(p.get("processor", -1)) in set(usable_cpus)]
    if not processors:
        raise ValueError("No usable processor found in /proc/cpuinfo")
    cores = len({(p.get("physical id"), p.get("core id", p.get("processor"))) for p in processors})
    flags = processors[0].get("flags", "").split()
    lanes, bits, note = simd_lanes(flags, compute_dtype)
    amx_flag = AMX_FLAGS.get(compute_dtype)
    amx = amx_flag in flags
    if amx:
        units = [
            f"AMX: {amx_flag} in /proc/cpuinfo flags, {AMX_FLOPS_PER_CYCLE} {compute_dtype} FLOP/cycle per core"
        ]
    else:
        units = [
            f"SIMD: {bits}-bit vectors ({_vector_flag(flags)} in /proc/cpuinfo flags)"
            + (f", {note}" if note else ""),
            f"FMA units per core: {fma_units} (assumed; not exposed by the machine)",
        ]
    sources = [
        f"cores: {cores} (distinct physical cores of the {len(processors)} logical CPUs this process may use)",
        *units,
        f"CPU flags: {cpu_flags(cpuinfo)}",
    ]
    cpu = processors[0].get("processor", "0")
    if max_frequency_khz is None:
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq")
        if path.exists():
            max_frequency_khz = float(path.read_text())
            sources.append(f"clock: {path}")
    else:
        sources.append("clock: given")
    if max_frequency_khz is None:
        max_frequency_khz = max(float(p["cpu MHz"]) for p in processors) * 1000
        sources.append(
            "clock: 'cpu MHz' in /proc/cpuinfo (the current clock; no cpufreq maximum exposed)"
        )
    clock_hz = max_frequency_khz * 1000
    device = f"{processors[0].get('model name', 'CPU')} (CPU)"
    if amx:
        formula = (
            f"{cores} cores x {AMX_FLOPS_PER_CYCLE} FLOP/cycle (AMX) x {clock_hz / 1e9:.3f} GHz"
        )
        return Peak(
            cores * AMX_FLOPS_PER_CYCLE * clock_hz, device, compute_dtype, formula, tuple(sources)
        )
    formula = f"{cores} cores x {fma_units} FMA units x {lanes} {compute_dtype} lanes x 2 x {clock_hz / 1e9:.3f} GHz"
    return Peak(
        cpu_peak_flops(cores, fma_units, lanes, clock_hz),
        device,
        compute_dtype,
        formula,
        tuple(sources),
    )


def gpu_peak(device_name, compute_dtype="float32", tf32=True):
    """The published dense peak of a GPU named `device_name` (e.g. "NVIDIA H100 80GB HBM3").

    Args:
        device_name: the name the driver reports.
        compute_dtype: "float32", "bfloat16" or "float16".
        tf32: float32 matmuls run as TF32 (TensorFlow's default on these GPUs).

    Raises:
        ValueError naming the device when it is not in `GPU_PEAKS`.
    """
    _check_dtype(compute_dtype)
    for pattern, label, peaks in GPU_PEAKS:
        if re.search(pattern, device_name):
            dtype = "tf32" if compute_dtype == "float32" and tf32 else compute_dtype
            return Peak(
                peaks[dtype] * 1e12,
                label,
                dtype,
                f"published dense {dtype} peak of the {label}",
                (f"device: {device_name!r}",),
            )
    known = ", ".join(label for _, label, _ in GPU_PEAKS)
    raise ValueError(
        f"No published peak for this GPU (known: {known}). Received: device_name={device_name!r}"
    )


def hardware_peak(compute_dtype="float32", fma_units=2):
    """The peak of the first visible GPU if TensorFlow sees one, else of the CPUs."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "")
        return gpu_peak(
            name, compute_dtype, tf32=tf.config.experimental.tensor_float_32_execution_enabled()
        )
    return cpu_peak(compute_dtype, fma_units=fma_units)

"""Model FLOPs per token, accelerator peak FLOP/s and MFU (DESIGN §3).

MFU counts the FLOPs the model mathematically needs (PaLM, Chowdhery et al. 2022, appendix B), not
what the hardware ran: activation recomputation and padding do not raise it, so it compares jobs
fairly. Standard library only; numpy is imported inside the CPU probe, the one place that needs it.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable

# Dense (no structured sparsity) peak FLOP/s per accelerator from the vendors' datasheets; bf16 as
# DESIGN §3 fixes them. Keys are (normalised model, dtype); fp16 runs at the bf16 rate on all of them.
PEAK_FLOPS: dict[tuple[str, str], float] = {
    ("a100", "bf16"): 312e12, ("a100", "fp16"): 312e12, ("a100", "tf32"): 156e12, ("a100", "fp32"): 19.5e12,
    ("h100-sxm", "bf16"): 989e12, ("h100-sxm", "fp16"): 989e12, ("h100-sxm", "fp8"): 1979e12,
    ("h100-sxm", "tf32"): 494.7e12, ("h100-sxm", "fp32"): 66.9e12,
    ("h100-pcie", "bf16"): 756e12, ("h100-pcie", "fp16"): 756e12, ("h100-pcie", "fp8"): 1513e12,
    ("h100-pcie", "tf32"): 378e12, ("h100-pcie", "fp32"): 51.2e12,
    # H200 is the H100 SXM chip with more and faster HBM: the same compute peaks.
    ("h200", "bf16"): 989e12, ("h200", "fp16"): 989e12, ("h200", "fp8"): 1979e12,
    ("h200", "tf32"): 494.7e12, ("h200", "fp32"): 66.9e12,
    ("b200", "bf16"): 2.25e15, ("b200", "fp16"): 2.25e15, ("b200", "fp8"): 4.5e15,
    ("mi300x", "bf16"): 1.3e15, ("mi300x", "fp16"): 1.3e15, ("mi300x", "fp8"): 2.6e15,
    ("mi300x", "tf32"): 653.7e12, ("mi300x", "fp32"): 163.4e12,
}

# (pattern, normalised model), first match wins, so a form factor is checked before its family. Word
# boundaries keep GB200 off B200, H800 off H100 and MI300A off MI300X; anything unlisted is unknown.
# NVL cards are recognised so they never borrow SXM peaks, but have no rows: their datasheets disagree.
_MODEL_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bH100\b.*\bPCIE\b"), "h100-pcie"),
    (re.compile(r"\bH100\b.*\bNVL\b"), "h100-nvl"),
    (re.compile(r"\bH100\b"), "h100-sxm"),
    (re.compile(r"\bH200\b.*\bNVL\b"), "h200-nvl"),
    (re.compile(r"\bH200\b"), "h200"),
    (re.compile(r"\bA100\b"), "a100"),  # PCIe and SXM A100s share their peaks
    (re.compile(r"\bB200\b"), "b200"),
    (re.compile(r"\bMI300X\b"), "mi300x"),
)

_DTYPE_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp8": "fp8", "float8": "fp8", "e4m3": "fp8", "e5m2": "fp8", "tf32": "tf32", "fp32": "fp32", "float32": "fp32",
}


def _require(value: float, name: str, *, positive: bool = False) -> None:
    """Raise ValueError unless value is finite and non-negative (or strictly positive)."""
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


def moe_active_params(*, dense_params: float, expert_params: float, experts: int, top_k: int) -> float:
    """Parameters one token passes through in a mixture-of-experts model: the shared (dense) part
    plus top_k experts. MFU uses this N, not the total, since unrouted experts do no work for it."""
    _require(dense_params, "dense_params")
    _require(expert_params, "expert_params", positive=True)
    if experts < 1 or not 1 <= top_k <= experts:
        raise ValueError(f"need experts >= 1 and 1 <= top_k <= experts, got experts={experts}, top_k={top_k}")
    return dense_params + top_k * expert_params


def model_flops_per_token(
    *,
    params: float,
    layers: int = 0,
    heads: int = 0,
    head_dim: int = 0,
    seq_len: int = 0,
    kv_heads: int | None = None,
    active_params: float | None = None,
    training: bool = True,
    flops_per_token: float | None = None,
) -> float:
    """FLOPs the model needs per token: 6·N + 12·L·H·Q·T to train, 2·N + 4·L·H·Q·T to serve.

    N is `active_params` when given (MoE), else `params`: every weight a token multiplies through,
    i.e. without lookup-only tables (input and position embeddings) but with the output projection;
    a tied input/output embedding therefore counts once. Each weight costs a multiply and an add
    forward (2N) and twice that backward (4N). The attention term is the QKᵀ scores and their
    product with V, which involve no weights: per layer and token 2·H·Q·T FLOPs for each, so
    4·L·H·Q·T forward and 12·L·H·Q·T in all. Serving runs the forward only, exactly a third of
    training; pass the mean attended context as `seq_len` there. Like PaLM, T counts the full T x T
    score square even though a causal kernel computes about half of it.

    `kv_heads` (GQA; 1 is multi-query) only validates: sharing K/V between query heads shrinks the
    K/V projection weights, which are already in N, but every query head still scores against and
    mixes all T keys and values, so the attention term keeps H query heads. PaLM reproduces its
    46.2% MFU with multi-query attention and H = 48.

    An explicit `flops_per_token` (e.g. from a profiler or the job's registration) wins over the rest.
    """
    if flops_per_token is not None:
        _require(flops_per_token, "flops_per_token", positive=True)
        return float(flops_per_token)
    _require(params, "params", positive=True)
    n = params
    if active_params is not None:
        _require(active_params, "active_params", positive=True)
        if active_params > params:
            raise ValueError(f"active_params ({active_params:g}) cannot exceed params ({params:g})")
        n = active_params
    shape = {"layers": layers, "heads": heads, "head_dim": head_dim, "seq_len": seq_len}
    for name, value in shape.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if any(shape.values()) and not all(shape.values()):
        missing = ", ".join(name for name, value in shape.items() if not value)
        raise ValueError(f"layers, heads, head_dim and seq_len go together; missing {missing}")
    if kv_heads is not None and (heads < 1 or not 1 <= kv_heads <= heads or heads % kv_heads):
        raise ValueError(f"kv_heads must divide heads and lie in 1..heads, got kv_heads={kv_heads}, heads={heads}")
    attention = layers * heads * head_dim * seq_len
    if training:
        return 6 * n + 12 * attention
    return 2 * n + 4 * attention


def normalise_accelerator_model(name: str) -> str | None:
    """The PEAK_FLOPS key for a model name as NVML or amd-smi reports it, or None when unknown.

    Simulated accelerators ("sim-h100-80gb") are unknown on purpose: they run on CPU cores, and
    their peak comes from `measure_cpu_peak_flops`, never from the GPU they are named after.
    """
    upper = name.upper().replace("-", " ").replace("_", " ")
    if re.search(r"\bSIM\b", upper):
        return None
    for pattern, model in _MODEL_PATTERNS:
        if pattern.search(upper):
            return model
    return None


def peak_flops(model: str, dtype: str = "bf16") -> float | None:
    """Dense peak FLOP/s of one accelerator in `dtype`, or None when the table does not know the
    model (simulated ones included), the dtype, or that pair; the caller then probes or asks the job."""
    key = normalise_accelerator_model(model)
    dtype_key = _DTYPE_ALIASES.get(dtype.lower())
    if key is None or dtype_key is None:
        return None
    return PEAK_FLOPS.get((key, dtype_key))


def measure_cpu_peak_flops(
    *,
    size: int = 512,
    repeats: int = 5,
    dtype: str = "float32",
    threads: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Achievable FLOP/s of this CPU on an n x n GEMM: the best of `repeats` timed runs of 2·n³ FLOPs.

    This is the "peak" of a `sim` accelerator, whose work runs on CPU cores: no datasheet applies,
    so the denominator of its MFU is what a well-shaped matmul reaches here. The best run, after a
    warm-up, approximates the ceiling rather than the noise. `threads` caps the BLAS threads (to
    match a slot's share of the host) and needs threadpoolctl; numpy loads its BLAS pool once.
    """
    if size < 1 or repeats < 1:
        raise ValueError(f"size and repeats must be >= 1, got size={size}, repeats={repeats}")
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    import numpy as np  # lazily: the rest of the SDK never needs it

    rng = np.random.default_rng(0)
    a = rng.random((size, size)).astype(dtype)
    b = rng.random((size, size)).astype(dtype)

    def best_seconds() -> float:
        np.matmul(a, b)  # warm-up: page in the buffers, spin up the BLAS threads
        best = math.inf
        for _ in range(repeats):
            start = clock()
            np.matmul(a, b)
            best = min(best, clock() - start)
        return best

    if threads is None:
        seconds = best_seconds()
    else:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError as exc:
            raise RuntimeError("measure_cpu_peak_flops(threads=...) needs threadpoolctl installed") from exc
        with threadpool_limits(limits=threads, user_api="blas"):
            seconds = best_seconds()
    return 2.0 * size**3 / max(seconds, 1e-9)


def achieved_flops(*, flops_per_token: float, tokens_per_second: float) -> float:
    """Model FLOP/s a job delivers: the numerator of MFU, and comparable across accelerator types."""
    _require(flops_per_token, "flops_per_token", positive=True)
    _require(tokens_per_second, "tokens_per_second")
    return flops_per_token * tokens_per_second


def mfu(
    *, flops_per_token: float, tokens_per_second: float, accelerators: int, peak_flops_per_accelerator: float
) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak of all accelerators the job holds.

    A stalled job reads 0. Above 1 means the peak or the FLOPs per token are wrong, and is returned
    as is rather than clipped, so the error shows.
    """
    if accelerators < 1:
        raise ValueError(f"accelerators must be >= 1, got {accelerators}")
    _require(peak_flops_per_accelerator, "peak_flops_per_accelerator", positive=True)
    achieved = achieved_flops(flops_per_token=flops_per_token, tokens_per_second=tokens_per_second)
    return achieved / (accelerators * peak_flops_per_accelerator)

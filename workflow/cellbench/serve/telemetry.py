"""GPU telemetry during a measured point: power, clocks, temperature and memory per GPU.

Two backends, each imported only when asked for:

* NVIDIA: NVML through ``nvidia-ml-py`` (``import pynvml``): power (``nvmlDeviceGetPowerUsage``,
  mW), the energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver
  loaded; Volta and later), SM and memory clocks, GPU temperature, memory used;
* AMD: ``amdsmi`` (ROCm's Python API): ``amdsmi_get_power_info``, ``amdsmi_get_energy_count``,
  ``amdsmi_get_clock_info``, ``amdsmi_get_temp_metric``, ``amdsmi_get_gpu_vram_usage``.

GPUs are addressed by the host's index (the lease's ``gpu_indices``), which is NVML's and
amdsmi's enumeration order on the host, not a container's renumbered view.

``GpuSampler.begin()`` starts a thread that samples every ``interval_s``; ``end()`` stops it
and returns the point's record: per GPU its samples (columns ``t_s``, ``power_w``,
``sm_clock_mhz``, ``mem_clock_mhz``, ``temp_c``, ``mem_used_mib``) and its energy over the
point, from the hardware counter where the GPU has one (``energy_source: "counter"``), else
the trapezoid integral of the power samples (``"power integral"``); and for the point
``energy_j`` (all GPUs), ``mean_power_w`` (all GPUs: energy over duration) and, once the
caller knows the output tokens, ``joules_per_output_token``.

Where nothing can be sampled (no GPU in the cell, no library, no driver) the record is
``{"available": false, "reason": ...}`` and the point is measured all the same.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Sequence
from typing import Any

DEFAULT_INTERVAL_S = 0.2
COLUMNS = ("t_s", "power_w", "sm_clock_mhz", "mem_clock_mhz", "temp_c", "mem_used_mib")


class TelemetryUnavailable(RuntimeError):
    """No telemetry for this cell; the message says why."""


def _import(name: str, package: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise TelemetryUnavailable(f"{package} is not importable ({e})") from None


class NvmlBackend:
    """NVIDIA GPUs through NVML (nvidia-ml-py)."""

    vendor = "nvidia"

    def __init__(self, indices: Sequence[int]):
        self.nv = _import("pynvml", "nvidia-ml-py (pynvml)")
        try:
            self.nv.nvmlInit()
        except self.nv.NVMLError as e:
            raise TelemetryUnavailable(f"NVML could not start: {e}") from None
        try:
            count = self.nv.nvmlDeviceGetCount()
            bad = [i for i in indices if not 0 <= i < count]
            if bad:
                raise TelemetryUnavailable(f"GPU index {bad} not among NVML's {count} GPUs")
            self.handles = [self.nv.nvmlDeviceGetHandleByIndex(i) for i in indices]
            self.names = [_text(self.nv.nvmlDeviceGetName(h)) for h in self.handles]
        except BaseException:
            self.close()
            raise
        self.has_counter = [self._energy_mj(h) is not None for h in self.handles]

    def _energy_mj(self, h: Any) -> float | None:
        try:
            return float(self.nv.nvmlDeviceGetTotalEnergyConsumption(h))
        except self.nv.NVMLError:
            return None

    def energy_j(self, k: int) -> float | None:
        mj = self._energy_mj(self.handles[k])
        return None if mj is None else mj / 1000.0

    def sample(self, k: int) -> dict[str, float | None]:
        nv, h = self.nv, self.handles[k]

        def read(fn: Any, *args: Any) -> Any:
            try:
                return fn(h, *args)
            except nv.NVMLError:
                return None

        power = read(nv.nvmlDeviceGetPowerUsage)
        mem = read(nv.nvmlDeviceGetMemoryInfo)
        return {
            "power_w": None if power is None else power / 1000.0,
            "sm_clock_mhz": read(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": read(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM),
            "temp_c": read(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU),
            "mem_used_mib": None if mem is None else mem.used / 2**20,
        }

    def close(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass


class AmdsmiBackend:
    """AMD GPUs through ROCm's amdsmi (its documented Python API)."""

    vendor = "amd"

    def __init__(self, indices: Sequence[int]):
        self.smi = _import("amdsmi", "amdsmi (ROCm's Python package)")
        err = getattr(self.smi, "AmdSmiException", Exception)
        try:
            self.smi.amdsmi_init()
        except err as e:
            raise TelemetryUnavailable(f"amdsmi could not start: {e}") from None
        try:
            handles = self.smi.amdsmi_get_processor_handles()
            bad = [i for i in indices if not 0 <= i < len(handles)]
            if bad:
                raise TelemetryUnavailable(f"GPU index {bad} not among amdsmi's {len(handles)}")
            self.handles = [handles[i] for i in indices]
            self.names = []
            for h in self.handles:
                info = self._call(self.smi.amdsmi_get_gpu_asic_info, h) or {}
                self.names.append(str(info.get("market_name", "AMD GPU")))
        except BaseException:
            self.close()
            raise
        self.has_counter = [self.energy_j(k) is not None for k in range(len(self.handles))]

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - amdsmi raises its own types; a field is then null
            return None

    def energy_j(self, k: int) -> float | None:
        e = self._call(self.smi.amdsmi_get_energy_count, self.handles[k])
        if not isinstance(e, dict):
            return None
        # The accumulator's key changed across ROCm releases; the resolution is in uJ.
        acc = e.get("energy_accumulator", e.get("power"))
        res = e.get("counter_resolution")
        if not isinstance(acc, int | float) or not isinstance(res, int | float):
            return None
        return float(acc) * float(res) / 1e6

    def sample(self, k: int) -> dict[str, float | None]:
        smi, h = self.smi, self.handles[k]
        power = self._call(smi.amdsmi_get_power_info, h) or {}
        watts = None
        for key in ("current_socket_power", "average_socket_power", "socket_power"):
            if isinstance(power.get(key), int | float):
                watts = float(power[key])
                break
        clocks = {}
        for name, kind in (("sm_clock_mhz", "GFX"), ("mem_clock_mhz", "MEM")):
            info = self._call(smi.amdsmi_get_clock_info, h, getattr(smi.AmdSmiClkType, kind))
            info = info or {}
            clocks[name] = info.get("clk", info.get("cur_clk"))
        temp = self._call(
            smi.amdsmi_get_temp_metric,
            h,
            smi.AmdSmiTemperatureType.HOTSPOT,
            smi.AmdSmiTemperatureMetric.CURRENT,
        )
        vram = self._call(smi.amdsmi_get_gpu_vram_usage, h) or {}
        return {
            "power_w": watts,
            **clocks,
            "temp_c": temp,
            "mem_used_mib": vram.get("vram_used"),  # amdsmi reports MB
        }

    def close(self) -> None:
        try:
            self.smi.amdsmi_shut_down()
        except Exception:  # noqa: BLE001
            pass


BACKENDS = {"nvidia": NvmlBackend, "amd": AmdsmiBackend}


def open_backend(vendor: str, indices: Sequence[int]) -> NvmlBackend | AmdsmiBackend:
    """The vendor's backend for these host GPU indices; TelemetryUnavailable says why not."""
    if vendor not in BACKENDS:
        raise TelemetryUnavailable(
            f"gpu_vendor {vendor}: the cell has no GPU to sample (local CPU runtime)"
        )
    if not indices:
        raise TelemetryUnavailable("no GPU was leased to this server (local runtime)")
    return BACKENDS[vendor](list(indices))


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _integral(ts: list[float], ws: list[float | None]) -> float:
    pts = [(t, w) for t, w in zip(ts, ws, strict=True) if w is not None]
    pairs = zip(pts, pts[1:], strict=False)
    return sum((t1 - t0) * (w0 + w1) / 2.0 for (t0, w0), (t1, w1) in pairs)


class GpuSampler:
    """Sample a cell's GPUs around one point (see the module docstring)."""

    def __init__(self, vendor: str, indices: Sequence[int], interval_s: float = DEFAULT_INTERVAL_S):
        if not interval_s > 0:
            raise ValueError(f"telemetry interval must be > 0 s, got {interval_s}")
        self.vendor, self.indices, self.interval_s = vendor, list(indices), interval_s
        self._backend: NvmlBackend | AmdsmiBackend | None = None
        self._reason: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._samples: list[dict[str, list]] = []
        self._energy0: list[float | None] = []

    def _take(self) -> None:
        assert self._backend is not None
        t = time.monotonic() - self._t0
        for k, cols in enumerate(self._samples):
            cols["t_s"].append(round(t, 4))
            for name, value in self._backend.sample(k).items():
                cols[name].append(value)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take()

    def begin(self) -> None:
        try:
            self._backend = open_backend(self.vendor, self.indices)
        except TelemetryUnavailable as e:
            self._reason = str(e)
            return
        self._samples = [{c: [] for c in COLUMNS} for _ in self.indices]
        self._t0 = time.monotonic()
        self._energy0 = [self._backend.energy_j(k) for k in range(len(self.indices))]
        self._take()
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)
        self._thread.start()

    def end(self) -> dict[str, Any]:
        self.record = self._end()
        return self.record

    def _end(self) -> dict[str, Any]:
        if self._backend is None:
            return unavailable(self._reason or "begin() was not called")
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._take()
        duration = time.monotonic() - self._t0
        backend = self._backend
        gpus = []
        try:
            for k, cols in enumerate(self._samples):
                e1 = backend.energy_j(k)
                e0 = self._energy0[k]
                if e0 is not None and e1 is not None:
                    energy, source = e1 - e0, "counter"
                else:
                    energy, source = _integral(cols["t_s"], cols["power_w"]), "power integral"
                watts = [w for w in cols["power_w"] if w is not None]
                gpus.append(
                    {
                        "index": self.indices[k],
                        "name": backend.names[k],
                        "energy_j": energy,
                        "energy_source": source,
                        "mean_power_w": energy / duration if duration > 0 else None,
                        "max_power_w": max(watts) if watts else None,
                        "samples": cols,
                    }
                )
        finally:
            backend.close()
        energy_j = sum(g["energy_j"] for g in gpus)
        return {
            "available": True,
            "vendor": backend.vendor,
            "interval_s": self.interval_s,
            "duration_s": duration,
            "samples": len(self._samples[0]["t_s"]) if self._samples else 0,
            "energy_j": energy_j,
            "mean_power_w": energy_j / duration if duration > 0 else None,
            "gpus": gpus,
        }


def with_tokens(record: dict[str, Any], output_tokens: int) -> dict[str, Any]:
    """Add ``joules_per_output_token`` (null without output tokens or telemetry)."""
    if record.get("available"):
        record["joules_per_output_token"] = (
            record["energy_j"] / output_tokens if output_tokens > 0 else None
        )
    return record


def unavailable(reason: str) -> dict[str, Any]:
    """The record of a point with no GPU telemetry."""
    return {"available": False, "reason": reason}

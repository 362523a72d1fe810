"""
NVIDIA GPUs through NVML (the `pynvml` module of the `nvidia-ml-py` distribution).

No driver, no library or no GPU is an answer (`GpuReport.available` false, with the reason),
never an exception and never a row of zeros. `trainmate doctor`, the sampler of the live display
and the sidebar's server all read NVML through `NvmlSource`.
"""

from __future__ import annotations

from typing import Any

from . import GpuProcess, GpuReport, GpuSample, MigSample


def _text(value: Any) -> str:
    # Old nvidia-ml-py releases return bytes, new ones str.
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSource:
    """Samples every GPU (and its MIG devices) through NVML; initialises NVML once."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._reason = ""
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except ImportError as exc:
            self._reason = f"nvidia-ml-py is not installed ({exc})"
        except Exception as exc:  # pynvml.NVMLError and its many subclasses
            self._reason = f"NVML could not start: {exc} (no NVIDIA driver on this machine?)"

    def sample(self) -> GpuReport:
        nv = self._nvml
        if nv is None:
            return GpuReport(False, "nvml", self._reason)
        try:
            driver = _text(nv.nvmlSystemGetDriverVersion())
            cuda = self._optional(nv.nvmlSystemGetCudaDriverVersion_v2)
            gpus = tuple(self._gpu(nv, i) for i in range(nv.nvmlDeviceGetCount()))
        except nv.NVMLError as exc:
            return GpuReport(False, "nvml", f"NVML query failed: {exc}")
        if not gpus:
            return GpuReport(False, "nvml", "NVML runs but reports no GPU", driver)
        cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else ""
        return GpuReport(
            True, "nvml", driver_version=driver, cuda_driver_version=cuda_text, gpus=gpus
        )

    def processes(self) -> tuple[GpuProcess, ...]:
        """`nvmlDeviceGetComputeRunningProcesses` of each GPU; pids are the host's (a container
        with its own pid namespace sees pids it may not be able to map)."""
        nv = self._nvml
        if nv is None:
            return ()
        found: list[GpuProcess] = []
        try:
            for index in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                for proc in self._optional(nv.nvmlDeviceGetComputeRunningProcesses, handle) or ():
                    used = getattr(proc, "usedGpuMemory", None)
                    # NVML_VALUE_NOT_AVAILABLE comes back as a huge unsigned or None.
                    known = isinstance(used, int) and 0 <= used < 2**63
                    found.append(GpuProcess(index, int(proc.pid), used if known else None))
        except nv.NVMLError:
            return tuple(found)
        return tuple(found)

    @staticmethod
    def _optional(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:  # NVMLError_NotSupported on many boards, e.g. power on some GPUs
            return None

    def _gpu(self, nv: Any, index: int) -> GpuSample:
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        memory = nv.nvmlDeviceGetMemoryInfo(handle)
        util = self._optional(nv.nvmlDeviceGetUtilizationRates, handle)
        temp = self._optional(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)
        power = self._optional(nv.nvmlDeviceGetPowerUsage, handle)
        limit = self._optional(nv.nvmlDeviceGetEnforcedPowerLimit, handle)
        return GpuSample(
            index=index,
            name=_text(nv.nvmlDeviceGetName(handle)),
            uuid=_text(nv.nvmlDeviceGetUUID(handle)),
            utilization_pct=float(util.gpu) if util is not None else None,
            memory_used_bytes=int(memory.used),
            memory_total_bytes=int(memory.total),
            temperature_c=float(temp) if temp is not None else None,
            power_w=power / 1000.0 if power is not None else None,
            power_limit_w=limit / 1000.0 if limit is not None else None,
            mig=self._mig(nv, handle),
            compute_capability=self._capability(nv, handle),
        )

    def _capability(self, nv: Any, handle: Any) -> tuple[int, int] | None:
        found = self._optional(nv.nvmlDeviceGetCudaComputeCapability, handle)
        return (int(found[0]), int(found[1])) if found else None

    def _mig(self, nv: Any, handle: Any) -> tuple[MigSample, ...]:
        mode = self._optional(nv.nvmlDeviceGetMigMode, handle)
        if not mode or mode[0] != nv.NVML_DEVICE_MIG_ENABLE:
            return ()
        found = []
        count = self._optional(nv.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        for i in range(count):
            mig = self._optional(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
            if mig is None:
                continue
            memory = nv.nvmlDeviceGetMemoryInfo(mig)
            found.append(
                MigSample(i, _text(nv.nvmlDeviceGetName(mig)), int(memory.used), int(memory.total))
            )
        return tuple(found)

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml = None


_shared: NvmlSource | None = None


def shared_nvml() -> NvmlSource:
    """One NvmlSource for the process (NVML initialised once, not once per run)."""
    global _shared
    if _shared is None:
        _shared = NvmlSource()
    return _shared

"""Metric sources: NVML for NVIDIA GPUs, psutil for the host. NVML absent is a normal state."""

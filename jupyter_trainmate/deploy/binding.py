"""onnxruntime with I/O binding: inputs and outputs bound once to buffers on the provider's device.

`InferenceSession.run` takes numpy inputs and returns numpy outputs: each call copies the inputs
to the provider's device, allocates the outputs there and copies them back. On the CUDA provider
those copies dominate a small model's latency and make a comparison with PyTorch on the GPU
unfair. `Bound` copies the inputs to the device once (`OrtValue`s), binds output buffers of the
shapes a first plain run gave, and each call is `run_with_iobinding` alone. The same code serves
the CPU provider (`device_type="cpu"`) and the CUDA provider (`"cuda"`, a device id); only the
CPU path has been run (tests and BENCHMARKS.md) in this project so far.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import onnxruntime


class Bound:
    """A session's inputs and outputs bound for repeated calls of `run()`."""

    def __init__(
        self,
        sess: onnxruntime.InferenceSession,
        fed: dict[str, np.ndarray],
        device_type: str = "cpu",
        device_id: int = 0,
    ) -> None:
        import numpy as np
        import onnxruntime as ort

        self.sess = sess
        self.names = [o.name for o in sess.get_outputs()]
        first = sess.run(self.names, fed)  # the outputs' shapes and dtypes at this input size
        self.binding = sess.io_binding()
        self._values: list[Any] = []  # the bound OrtValues live as long as the binding
        for name, array in fed.items():
            value = ort.OrtValue.ortvalue_from_numpy(
                np.ascontiguousarray(array), device_type, device_id
            )
            self.binding.bind_ortvalue_input(name, value)
            self._values.append(value)
        for name, array in zip(self.names, first, strict=True):
            if isinstance(array, np.ndarray):
                value = ort.OrtValue.ortvalue_from_shape_and_type(
                    list(array.shape), array.dtype.type, device_type, device_id
                )
                self.binding.bind_ortvalue_output(name, value)
                self._values.append(value)
            else:  # a sequence or map: onnxruntime allocates it on each call
                self.binding.bind_output(name, device_type, device_id)

    def run(self) -> None:
        self.sess.run_with_iobinding(self.binding)

    def outputs(self) -> dict[str, np.ndarray]:
        """The bound outputs of the last `run()`, copied to numpy."""
        return dict(zip(self.names, self.binding.copy_outputs_to_cpu(), strict=True))

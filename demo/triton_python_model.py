"""Triton python-backend model that serves the ONNX file beside it with onnxruntime.

This file is copied as ``model.py`` into a model version directory next to
``model.onnx``. Triton imports it inside the python backend stub, so it may only
import what the model's execution environment (EXECUTION_ENV_PATH) provides:
numpy and onnxruntime, plus Triton's own ``triton_python_backend_utils``.

Every output named in the model config is taken from the ONNX output of the
same name, cast to the configured data type and reshaped to
``(batch, *dims)``.
"""

import json
from pathlib import Path

import numpy as np
import onnxruntime
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Runs ``<version dir>/model.onnx`` for each request."""

    def initialize(self, args):
        """Open the ONNX file of this version.

        Args:
            args: Triton's dict of strings; uses ``model_repository`` (the model's
                directory), ``model_version`` and ``model_config`` (JSON).

        Raises:
            Exception: any onnxruntime error opening the file; Triton then
                reports the load as failed with this message.
        """
        model_config = json.loads(args["model_config"])
        onnx_path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        options = onnxruntime.SessionOptions()
        # One thread each: a Triton host runs many model instances side by side.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(
            str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self.batched = model_config.get("max_batch_size", 0) > 0
        self.input_name = model_config["input"][0]["name"]
        self.onnx_input_name = self.session.get_inputs()[0].name
        self.outputs = [
            (
                output["name"],
                pb_utils.triton_string_to_numpy(output["data_type"]),
                [int(d) for d in output["dims"]],
            )
            for output in model_config["output"]
        ]

    def execute(self, requests):
        """Run the ONNX model once per request.

        Args:
            requests: list of ``pb_utils.InferenceRequest`` carrying the configured input.

        Returns:
            One ``pb_utils.InferenceResponse`` per request, in the same order.
        """
        responses = []
        for request in requests:
            features = pb_utils.get_input_tensor_by_name(request, self.input_name).as_numpy()
            names = [name for name, _, _ in self.outputs]
            results = self.session.run(names, {self.onnx_input_name: features.astype(np.float32)})
            tensors = []
            for (name, dtype, dims), value in zip(self.outputs, results, strict=True):
                shape = ([features.shape[0]] if self.batched else []) + dims
                tensors.append(pb_utils.Tensor(name, np.asarray(value, dtype=dtype).reshape(shape)))
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def finalize(self):
        """Release the onnxruntime session."""
        self.session = None

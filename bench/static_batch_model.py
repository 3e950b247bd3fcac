"""Triton python-backend model for the profile benchmark: a dense layer compiled for a static batch.

``bench/profile_card.py`` copies this file as ``model.py`` into a model version directory it builds
at run time. Triton imports it inside the python backend stub, so it imports only numpy and
Triton's ``triton_python_backend_utils``.

What it computes: ``label = argmax(relu(x @ W))`` for each row ``x`` (FP32, the config's input
width), with ``W`` an FP32 matrix of input width × ``HIDDEN_UNITS`` (a config parameter) drawn from
a fixed seed when an instance loads, so the archive stays a few kilobytes while each instance
holds the whole matrix (32 MiB for 1,024 × 8,192).

Why a static batch: like a TensorRT engine or a graph exported with a fixed batch dimension, every
execution computes a full batch of the config's ``max_batch_size`` rows (the rows it was given,
padded with zeros). One execution costs the same whether it carries one request or eight, so
Triton's dynamic batcher, which hands an execution every request waiting in its queue, multiplies
throughput, and the serving config visibly matters even on a CPU host whose HTTP overhead hides
the differences between configs of a model as small as the demo iris classifier.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

SEED = 16


class TritonPythonModel:
    """One instance: the weight matrix and the static batch it computes."""

    def initialize(self, args):
        """Draw the weights and read the batch to pad to.

        Args:
            args: Triton's dict of strings; uses ``model_config`` (JSON): ``max_batch_size`` (the
                static batch, at least 1), the first input's name and ``dims`` (the input width) and
                the ``HIDDEN_UNITS`` parameter (the matrix's other side).
        """
        config = json.loads(args["model_config"])
        self.batch = max(1, int(config.get("max_batch_size", 0)))
        self.input_name = config["input"][0]["name"]
        width = int(config["input"][0]["dims"][0])
        hidden = int(config["parameters"]["HIDDEN_UNITS"]["string_value"])
        self.weights = np.random.default_rng(SEED).standard_normal((width, hidden), dtype=np.float32)

    def execute(self, requests):
        """Compute every request's rows in one static-batch pass.

        Args:
            requests: list of ``pb_utils.InferenceRequest``; each input is FP32 ``[rows, width]``,
                the rows of all requests together at most ``max_batch_size``.

        Returns:
            One ``pb_utils.InferenceResponse`` per request, in order: ``label`` INT64 ``[rows, 1]``.
        """
        inputs = [pb_utils.get_input_tensor_by_name(r, self.input_name).as_numpy() for r in requests]
        rows = sum(len(x) for x in inputs)
        padded = np.zeros((max(self.batch, rows), self.weights.shape[0]), dtype=np.float32)
        padded[:rows] = np.concatenate(inputs)
        labels = np.maximum(padded @ self.weights, 0).argmax(axis=1).astype(np.int64)[:rows, None]
        responses, start = [], 0
        for x in inputs:
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("label", labels[start:start + len(x)])]))
            start += len(x)
        return responses

    def finalize(self):
        """Release the weights."""
        self.weights = None

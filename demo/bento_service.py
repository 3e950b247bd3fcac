"""The demo iris classifier as a BentoML 1.4 service (``@bentoml.service``).

``demo.iris_bento`` saves the scikit-learn model to a Bento Store as ``iris-classifier`` and builds
this file, as ``service.py``, into the Bento ``iris-bento``; a BentoML host serves it under
``/iris-bento/``::

    POST /iris-bento/classify  {"features": [[5.1, 3.5, 1.4, 0.2], ...]}  ->  ["setosa", ...]

Each row is sepal length, sepal width, petal length and petal width in cm; the answer holds one
species name per row.
"""

import bentoml
import numpy as np

SPECIES = ("setosa", "versicolor", "virginica")


@bentoml.service(traffic={"timeout": 30})
class IrisClassifier:
    """Loads the classifier the Bento was built with, once per worker."""

    model_ref = bentoml.models.BentoModel("iris-classifier:latest")

    def __init__(self) -> None:
        self.model = bentoml.sklearn.load_model(self.model_ref)

    @bentoml.api
    def classify(self, features: np.ndarray) -> list[str]:
        """Species of each flower: ``features`` is float, shape [n, 4] (cm); returns n names."""
        return [SPECIES[int(label)] for label in self.model.predict(np.asarray(features, dtype=np.float32))]

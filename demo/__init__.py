"""Demo models that Modelyard can register and deploy (see ``python -m demo.iris``)."""

"""Modelyard: a model registry and lifecycle dashboard for Triton and BentoML fleets."""

from modelyard.celery import app as celery_app

__all__ = ["celery_app"]

from django.urls import path

from monitoring import views

app_name = "monitoring"
urlpatterns = [
    path("models/<str:name>/panel/", views.model_metrics_panel, name="model-metrics-panel"),
]

from django.urls import path

from monitoring import views

app_name = "monitoring"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("table/", views.overview_table, name="overview-table"),
    path("by-host/", views.overview_by_host, name="overview-by-host"),
    path("models/<str:name>/panel/", views.model_metrics_panel, name="model-metrics-panel"),
    path("models/<str:name>/traffic/", views.model_traffic, name="model-traffic"),
    path("models/<str:name>/on-demand/", views.model_on_demand, name="model-on-demand"),
    path("hosts/<str:name>/traffic/", views.host_traffic, name="host-traffic"),
    path("rollouts/<int:pk>/canary/", views.rollout_canary_traffic, name="rollout-canary-traffic"),
]

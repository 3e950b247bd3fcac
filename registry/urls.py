from django.urls import path

from registry import views

app_name = "registry"
urlpatterns = [
    path("", views.model_list, name="model-list"),
    path("<str:name>/", views.model_detail, name="model-detail"),
    path("<str:name>/versions/<int:version>/", views.version_detail, name="version-detail"),
    path("<str:name>/versions/<int:version>/download", views.version_download, name="version-download"),
]

from django.urls import path

from registry import views

app_name = "registry"
urlpatterns = [
    path("", views.model_list, name="model-list"),
    path("<str:name>/", views.model_detail, name="model-detail"),
]

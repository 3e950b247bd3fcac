from django.urls import path

from deployments import views

app_name = "deployments"
urlpatterns = [
    path("", views.host_list, name="host-list"),
    path("new/", views.host_create, name="host-create"),
    path("<str:name>/", views.host_detail, name="host-detail"),
]

from django.urls import path

from deployments import job_pages, views

app_name = "deployments"
urlpatterns = [
    path("hosts/", views.host_list, name="host-list"),
    path("hosts/new/", views.host_create, name="host-create"),
    path("hosts/<str:name>/", views.host_detail, name="host-detail"),
    path("hosts/<str:name>/delete/", views.host_delete, name="host-delete"),
    path("hosts/<str:name>/models/<str:model_name>/unload/", views.host_model_unload, name="host-model-unload"),
    path("hosts/<str:name>/models/<str:model_name>/reload/", views.host_model_reload, name="host-model-reload"),
    path("deployments/new/<str:model_name>/", views.rollout_create, name="rollout-create"),
    path("deployments/try/<str:model_name>/", views.try_it, name="try-it"),
    path("deployments/of/<str:model_name>/", views.model_deployments, name="model-deployments"),
    path("deployments/serving/<str:model_name>/", views.model_serving, name="model-serving"),
    path("deployments/capture/<str:model_name>/", views.model_capture, name="model-capture"),
    path("profiles/of/<str:model_name>/<int:version>/", job_pages.version_profiles, name="version-profiles"),
    path("profiles/of/<str:model_name>/<int:version>/start/", job_pages.version_profile_start,
         name="version-profile-start"),
    path("profiles/<int:pk>/cancel/", job_pages.profile_cancel, name="profile-cancel"),
    path("replays/of/<str:model_name>/<int:version>/", job_pages.version_replays, name="version-replays"),
    path("replays/<int:pk>/", job_pages.replay_detail, name="replay-detail"),
    path("replays/<int:pk>/progress/", job_pages.replay_progress, name="replay-progress"),
    path("deployments/<int:pk>/", views.rollout_detail, name="rollout-detail"),
    path("deployments/<int:pk>/progress/", views.rollout_progress, name="rollout-progress"),
    path("deployments/<int:pk>/canary/", views.rollout_canary, name="rollout-canary"),
    path("deployments/<int:pk>/<str:action>/", views.rollout_action, name="rollout-action"),
]

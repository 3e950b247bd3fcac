from django.urls import path

from promotions import views

app_name = "promotions"
urlpatterns = [
    path("models/<str:model_name>/", views.model_policies, name="model-policies"),
    path("models/<str:model_name>/new/", views.policy_create, name="policy-create"),
    path("policies/<int:policy_id>/", views.policy_detail, name="policy-detail"),
    path("policies/<int:policy_id>/edit/", views.policy_edit, name="policy-edit"),
    path("policies/<int:policy_id>/run/", views.policy_run, name="policy-run"),
    path("policies/<int:policy_id>/pause/", views.policy_pause, name="policy-pause"),
    path("policies/<int:policy_id>/resume/", views.policy_resume, name="policy-resume"),
    path("evaluations/<int:evaluation_id>/approve/", views.evaluation_approve, name="evaluation-approve"),
    path("evaluations/<int:evaluation_id>/reject/", views.evaluation_reject, name="evaluation-reject"),
]

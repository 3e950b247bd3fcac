from django.urls import path

from registry import views

app_name = "registry"
urlpatterns = [
    path("", views.model_list, name="model-list"),
    path("<str:name>/", views.model_detail, name="model-detail"),
    path("<str:name>/edit/", views.model_edit, name="model-edit"),
    path("<str:name>/inference-keys/", views.inference_keys, name="inference-keys"),
    path("<str:name>/inference-keys/<int:key_id>/revoke/", views.inference_key_revoke, name="inference-key-revoke"),
    path("<str:name>/upload/", views.version_upload, name="version-upload"),
    path("<str:name>/compare/", views.version_compare, name="version-compare"),
    path("<str:name>/aliases/", views.alias_set, name="alias-set"),
    path("<str:name>/aliases/<str:alias>/delete/", views.alias_delete, name="alias-delete"),
    path("<str:name>/aliases/<str:alias>/protect/", views.alias_protect, name="alias-protect"),
    path("<str:name>/versions/<int:version>/", views.version_detail, name="version-detail"),
    path("<str:name>/versions/<int:version>/delete/", views.version_delete, name="version-delete"),
    path("<str:name>/versions/<int:version>/card/", views.card_edit, name="card-edit"),
    path("<str:name>/versions/<int:version>/README.md", views.card_readme, name="card-readme"),
    path("<str:name>/versions/<int:version>/download", views.version_download, name="version-download"),
]

from django.urls import path

from accounts import views

app_name = "accounts"
urlpatterns = [
    path("teams/", views.team_list, name="team-list"),
    path("tokens/", views.token_list, name="token-list"),
    path("tokens/new/", views.token_create, name="token-create"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token-revoke"),
]

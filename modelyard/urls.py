"""Project URLs: pages, the REST API under /api/v1/, the OpenAPI schema and its docs, admin, health and /metrics."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpResponse
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from accounts.api.teams import TeamViewSet
from accounts.api.views import ApiTokenViewSet, WhoAmIView
from deployments.api.views import (
    DeploymentViewSet,
    ModelCaptureView,
    ModelInferenceView,
    ProfileViewSet,
    ReplayViewSet,
    ServingHostViewSet,
    VersionProfilesView,
    VersionReplaysView,
)
from modelyard.api_errors import api_not_found
from monitoring.api.sd import ScrapeTargetsView
from monitoring.api.views import ModelCompareView, ModelMetricSeriesView, ModelMetricsView
from monitoring.exporter import metrics_view
from promotions.api.views import PromotionEvaluationViewSet, PromotionPolicyViewSet, WebhookViewSet
from registry import views as registry_views
from registry.api.inference_keys import InferenceKeyViewSet
from registry.api.uploads import UploadCompleteView, UploadDetailView, UploadPartUrlsView, UploadStartView
from registry.api.views import (
    AliasDetailView,
    AliasListView,
    AuditEventViewSet,
    ModelCardReadmeView,
    ModelCardView,
    ModelVersionViewSet,
    RegisteredModelViewSet,
)

router = DefaultRouter()
router.register("tokens", ApiTokenViewSet, basename="token")
router.register("models", RegisteredModelViewSet, basename="model")
router.register("hosts", ServingHostViewSet, basename="host")
router.register("deployments", DeploymentViewSet, basename="deployment")
router.register("audit", AuditEventViewSet, basename="audit")
router.register("promotion-policies", PromotionPolicyViewSet, basename="promotion-policy")
router.register("promotion-evaluations", PromotionEvaluationViewSet, basename="promotion-evaluation")
router.register("webhooks", WebhookViewSet, basename="webhook")
router.register("teams", TeamViewSet, basename="team")
router.register("profiles", ProfileViewSet, basename="profile")
router.register("replays", ReplayViewSet, basename="replay")
router.register("inference-keys", InferenceKeyViewSet, basename="inference-key")

version_list = ModelVersionViewSet.as_view({"get": "list", "post": "create"})
version_detail = ModelVersionViewSet.as_view({"get": "retrieve", "delete": "destroy"})

api_v1 = [
    path("models/<str:model_name>/versions/", version_list, name="model-version-list"),
    path("models/<str:model_name>/versions/<int:version>/", version_detail, name="model-version-detail"),
    path("models/<str:model_name>/versions/<int:version>/profiles/", VersionProfilesView.as_view(),
         name="model-version-profiles"),
    path("models/<str:model_name>/versions/<int:version>/replays/", VersionReplaysView.as_view(),
         name="model-version-replays"),
    path("models/<str:model_name>/versions/<int:version>/card/", ModelCardView.as_view(), name="model-card"),
    path("models/<str:model_name>/versions/<int:version>/card/readme/", ModelCardReadmeView.as_view(),
         name="model-card-readme"),
    path("models/<str:model_name>/aliases/", AliasListView.as_view(), name="model-alias-list"),
    path("models/<str:model_name>/aliases/<str:alias>/", AliasDetailView.as_view(), name="model-alias-detail"),
    path("models/<str:model_name>/uploads/", UploadStartView.as_view(), name="model-upload-start"),
    path("uploads/<uuid:upload_id>/", UploadDetailView.as_view(), name="upload-detail"),
    path("uploads/<uuid:upload_id>/parts/", UploadPartUrlsView.as_view(), name="upload-parts"),
    path("uploads/<uuid:upload_id>/complete/", UploadCompleteView.as_view(), name="upload-complete"),
    path("models/<str:model_name>/metrics/", ModelMetricsView.as_view(), name="model-metrics"),
    path("models/<str:model_name>/compare/", ModelCompareView.as_view(), name="model-compare"),
    path("models/<str:model_name>/infer/", ModelInferenceView.as_view(), name="model-infer"),
    path("models/<str:model_name>/capture/", ModelCaptureView.as_view(), name="model-capture"),
    path("models/<str:model_name>/metrics/series/", ModelMetricSeriesView.as_view(), name="model-metric-series"),
    path("prometheus/targets/", ScrapeTargetsView.as_view(), name="prometheus-targets"),
    path("whoami/", WhoAmIView.as_view(), name="whoami"),
    path("", include(router.urls)),
    re_path(r"^.*$", api_not_found, name="not-found"),  # last: any other path under /api/v1/
]


def healthz(request):
    """Liveness probe: 200 ``ok`` while the web process answers."""
    return HttpResponse("ok", content_type="text/plain")


# Django's own error answers: the error envelope under /api/, the pages elsewhere.
handler400 = "modelyard.api_errors.handler400"
handler404 = "modelyard.api_errors.handler404"
handler500 = "modelyard.api_errors.handler500"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="registry:model-list", permanent=False)),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # Swagger UI, its page and its start script apart: the CSP allows no inline script or style.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema", template_name="api_docs.html"),
         name="api-docs"),
    path("api/v1/", include((api_v1, "api"), namespace="api")),
    # Any other path under /api/ answers the error envelope by a route of its own, so that it does with
    # DEBUG on too (Django's handler404 answers only with DEBUG off; on, it shows its debug page).
    re_path(r"^api/", api_not_found, name="api-not-found"),
    path("account/", include("accounts.urls")),
    path("models/", include("registry.urls")),
    path("audit/", registry_views.audit_log, name="audit-log"),
    path("", include("deployments.urls")),
    path("monitoring/", include("monitoring.urls")),
    path("promotions/", include("promotions.urls")),
]

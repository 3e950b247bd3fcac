"""Deployments pages: the serving hosts list."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from deployments.models import ServingHost


@login_required
def host_list(request):
    """Every serving host with its runtime and endpoints."""
    return render(request, "deployments/host_list.html", {"hosts": ServingHost.objects.order_by("name")})

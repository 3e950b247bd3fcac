"""Query filters of the deployment, profile and replay lists: ``?model=<name>``, ``?host=<name>``, ``?status=``.

The long names of the same filters (``model__name``, ``version__model__name``, ``host__name``) are kept, so
links and scripts written against them still filter.
"""

import django_filters

from deployments.models import Deployment, Profile, Replay


class DeploymentFilter(django_filters.FilterSet):
    """``model`` (the model's name), ``status``, ``follow_alias`` (deployments an alias move made)."""

    model = django_filters.CharFilter(field_name="model__name", help_text="The model's name")

    class Meta:
        model = Deployment
        fields = {"model__name": ["exact"], "status": ["exact"], "follow_alias": ["exact"]}


class AgentJobFilter(django_filters.FilterSet):
    """Filters of an agent job list (profiles, replays): ``model`` (the version's model name), ``host``
    (the serving host's name), ``status``."""

    model = django_filters.CharFilter(field_name="version__model__name", help_text="The model's name")
    host = django_filters.CharFilter(field_name="host__name", help_text="The serving host's name")

    class Meta:
        fields = {"status": ["exact"], "host__name": ["exact"], "version__model__name": ["exact"]}


class ProfileFilter(AgentJobFilter):
    class Meta(AgentJobFilter.Meta):
        model = Profile


class ReplayFilter(AgentJobFilter):
    class Meta(AgentJobFilter.Meta):
        model = Replay

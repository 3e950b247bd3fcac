"""Query filters of the promotion policy and evaluation lists: ``?model=<name>`` beside the long names
(``model__name``, ``policy__model__name``), which are kept so links and scripts written against them still filter."""

import django_filters

from promotions.models import PromotionEvaluation, PromotionPolicy


class PromotionPolicyFilter(django_filters.FilterSet):
    """``model`` (the model's name), ``enabled``."""

    model = django_filters.CharFilter(field_name="model__name", help_text="The model's name")

    class Meta:
        model = PromotionPolicy
        fields = {"model__name": ["exact"], "enabled": ["exact"]}


class PromotionEvaluationFilter(django_filters.FilterSet):
    """``model`` (the policy's model name), ``policy`` (its id), ``decision``."""

    model = django_filters.CharFilter(field_name="policy__model__name", help_text="The model's name")

    class Meta:
        model = PromotionEvaluation
        fields = {"policy": ["exact"], "decision": ["exact"], "policy__model__name": ["exact"]}

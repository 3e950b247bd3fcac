"""Forms of the deployments pages."""

from django import forms

from deployments.choices import FailurePolicy, Residency, Runtime
from deployments.models import MAX_DEADLINE_SECONDS
from modelyard.forms import KeepEveryCharacter
from modelyard.jsonobject import parse_json_object
from modelyard_agent.contract import MAX_REQUEST_BYTES, MIN_REQUEST_BYTES


class ServingHostForm(KeepEveryCharacter, forms.Form):
    """Register a serving host from the browser; the service does the validation."""

    name = forms.CharField(max_length=63, help_text="lower-case letters, digits, '-' and '_'")
    runtime = forms.ChoiceField(choices=Runtime.choices, initial=Runtime.TRITON)
    inference_url = forms.CharField(max_length=200, help_text="e.g. http://gpu-0:8000")
    metrics_url = forms.CharField(max_length=200, required=False, help_text="e.g. http://gpu-0:8002/metrics")
    production = forms.BooleanField(required=False, help_text="Serves production traffic: rollouts need a team owner")
    load_deadline = forms.IntegerField(
        required=False, min_value=1, max_value=MAX_DEADLINE_SECONDS, label="Load deadline (s)",
        help_text="How long one load may take here before the agent abandons it; blank: the fleet default")
    unload_deadline = forms.IntegerField(
        required=False, min_value=1, max_value=MAX_DEADLINE_SECONDS, label="Unload deadline (s)",
        help_text="How long one unload may take here; blank: the fleet default")
    parameters = forms.CharField(
        label="Config overrides: parameters", required=False, widget=forms.Textarea(attrs={"rows": 3}),
        help_text='Per-host model parameters as JSON, e.g. {"EXECUTION_ENV_PATH": "/opt/envs/py311"}',
    )

    def clean_parameters(self) -> dict:
        return _clean_json_object(self.cleaned_data["parameters"])


def _json_object_field(label: str, help_text: str) -> forms.CharField:
    return forms.CharField(label=label, required=False, widget=forms.Textarea(attrs={"rows": 3}), help_text=help_text)


def _clean_json_object(raw: str) -> dict:
    raw = (raw or "").strip()
    if not raw:
        return {}
    try:
        return parse_json_object(raw)
    except ValueError as exc:
        raise forms.ValidationError(str(exc)) from exc


class HostTable(forms.CheckboxSelectMultiple):
    """The rollout form's hosts as a table: a checkbox per host, with its runtime, its agent's state,
    the version of the model it serves now and its production mark (``rows``: the form's host rows)."""

    template_name = "deployments/widgets/host_table.html"
    rows: tuple | list = ()

    def get_context(self, name, value, attrs) -> dict:
        context = super().get_context(name, value, attrs)
        chosen = {str(v) for v in value or []}
        base = context["widget"]["attrs"].get("id", f"id_{name}")
        context["rows"] = [{**row, "checked": row["host"].name in chosen, "id": f"{base}_{number}"}
                           for number, row in enumerate(self.rows)]
        return context


class RolloutForm(KeepEveryCharacter, forms.Form):
    """Start a rollout from the browser: a version or an alias, hosts or a selector, batches."""

    version = forms.TypedChoiceField(coerce=int, required=False, empty_value=None,
                                     help_text="pin this version, or leave empty and follow an alias")
    alias = forms.ChoiceField(required=False, help_text="follow this alias: moving it starts the next rollout")
    hosts = forms.MultipleChoiceField(required=False, widget=HostTable)
    selector = forms.CharField(required=False, help_text="or choose hosts by labels, e.g. pool=gpu,zone=a")
    replicas = forms.IntegerField(required=False, min_value=1, help_text="with a selector: how many hosts, "
                                  "picked by free GPU memory")
    batch_size = forms.IntegerField(min_value=1, initial=1, help_text="hosts moved at once (max unavailable)")
    canary_percent = forms.FloatField(
        required=False, min_value=0, max_value=100, label="Canary percent",
        help_text="load the version beside the one each host serves and send it this % of the requests that "
                  "name no version (the rest stay on the serving one); empty: a plain rollout that replaces it")
    shadow_percent = forms.FloatField(
        required=False, min_value=0, max_value=100, label="Shadow percent",
        help_text="also send the version a copy of this % of those requests; no client sees its answers "
                  "(alone, without a canary percent: a shadow that takes no traffic)")
    failure_policy = forms.ChoiceField(choices=FailurePolicy.choices, initial=FailurePolicy.PAUSE)
    config_overrides = _json_object_field(
        "Config overrides", 'e.g. {"instance_group": [{"count": 2, "kind": "KIND_GPU"}], '
        '"dynamic_batching": {"max_queue_delay_microseconds": 100}}')
    max_request_bytes = forms.IntegerField(
        required=False, min_value=MIN_REQUEST_BYTES, max_value=MAX_REQUEST_BYTES, label="Request body limit (bytes)",
        help_text="the most an infer request body may hold at the hosts' gateways (413 beyond); empty: derived "
                  "from the version's signature")
    residency = forms.ChoiceField(
        choices=Residency.choices, initial=Residency.ALWAYS, required=False, label="Residency",
        help_text="on demand: each host registers the model but loads it at its first request (held until then) "
                  "and evicts it when its memory budget needs room; Triton hosts only")
    pinned = forms.BooleanField(required=False, label="Pinned", help_text="on demand: never evicted once loaded")
    cold_start_timeout = forms.FloatField(
        required=False, min_value=0.1, max_value=600, label="Cold-start timeout (seconds)",
        help_text="on demand: how long a request waits for the model to load before a 503; empty: 30 s")
    confirm_breaking = forms.BooleanField(
        required=False, label="Roll out although it breaks the signature",
        help_text="needed when the version's inputs, outputs or batching break the clients of the version it "
                  "replaces on a host (the page says what breaks)")

    confirm_unreachable = forms.BooleanField(
        required=False, label="Roll out to hosts that are offline or never reported",
        help_text="each such host's part fails after a deadline unless its agent reports by then")

    def __init__(self, *args, versions: list[int], aliases: list[str], hosts: list[dict], **kwargs):
        """``hosts``: ``deployments.serving.rollout_host_rows`` of the model (each host with its agent's
        state, the version it serves and a ``warning`` when it is offline or never reported)."""
        super().__init__(*args, **kwargs)
        self.fields["version"].choices = [("", "—")] + [(v, f"v{v}") for v in versions]
        self.fields["alias"].choices = [("", "—")] + [(a, f"@{a}") for a in aliases]
        self.fields["hosts"].choices = [(row["host"].name, row["host"].name) for row in hosts]
        self.fields["hosts"].widget.rows = hosts
        self.warnings = {row["host"].name: row["warning"] for row in hosts if row["warning"]}

    def clean(self) -> dict:
        data = super().clean()
        if data.get("replicas") and not data.get("selector"):
            self.add_error("replicas", "replicas picks that many hosts among those a selector matches: give a "
                                       "selector, or tick the hosts instead")
        unreachable = [self.warnings[name] for name in data.get("hosts") or [] if name in self.warnings]
        if unreachable and not data.get("confirm_unreachable"):
            self.add_error("confirm_unreachable", " ".join(unreachable) + " Tick the box to roll out anyway.")
        return data

    def clean_selector(self) -> dict:
        raw = self.cleaned_data["selector"].strip()
        labels = {}
        for pair in filter(None, (p.strip() for p in raw.split(","))):
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                raise forms.ValidationError(f"write labels as key=value, separated by commas; not {pair!r}")
            labels[key.strip()] = value.strip()
        return labels

    def clean_config_overrides(self) -> dict:
        return _clean_json_object(self.cleaned_data["config_overrides"])


class TryItForm(KeepEveryCharacter, forms.Form):
    """Send one inference request to a deployed version on a chosen host."""

    host = forms.ChoiceField()
    version = forms.TypedChoiceField(coerce=int, required=False, empty_value=None,
                                     help_text="empty: whichever version the host serves")
    inputs = forms.CharField(widget=forms.Textarea(attrs={"rows": 6, "class": "mono"}),
                             help_text="input tensors by name, with the batch dimension, "
                             'e.g. {"input": [[5.1, 3.5, 1.4, 0.2]]}')

    def __init__(self, *args, hosts: list[str], versions: list[int], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["host"].choices = [(h, h) for h in hosts]
        self.fields["version"].choices = [("", "served")] + [(v, f"v{v}") for v in versions]

    def clean_inputs(self) -> dict:
        return _clean_json_object(self.cleaned_data["inputs"])


class ProfileForm(forms.Form):
    """Start a performance profile of a version from its page: a host, a named sweep, an SLO."""

    host = forms.ChoiceField(help_text="the host to measure on; a staging host keeps production untouched")
    preset = forms.ChoiceField(choices=[("quick", "quick: 1–2 instances, batching off/on, concurrency 1 and 4"),
                                        ("standard", "standard: 1, 2, 4 instances, batching off/on, "
                                                     "concurrency 1–16")], initial="quick")
    slo_p99_ms = forms.FloatField(required=False, min_value=0.001, max_value=600_000, label="p99 target (ms)",
                                  help_text="the recommendation is the highest throughput whose client p99 stays "
                                            "under this; empty: the highest throughput measured")

    def __init__(self, *args, hosts: list[tuple[str, str]], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["host"].choices = hosts


class CaptureForm(forms.Form):
    """The "Request capture" panel's form: the share captured, the bound per host in MiB, the retention in
    days, and a confirmation that captured requests hold users' data (needed to turn capture on)."""

    fraction = forms.FloatField(min_value=0, max_value=1, help_text="0 turns capture off and deletes what was kept")
    max_mib = forms.IntegerField(min_value=1, label="Max MiB per host")
    retention_days = forms.FloatField(min_value=1 / 24, label="Retention (days)")
    confirm = forms.BooleanField(required=False, label="I understand that captured requests hold our users' data")

    def clean(self):
        data = super().clean()
        if data.get("fraction") and not data.get("confirm"):
            raise forms.ValidationError("confirm that captured requests hold users' data to turn capture on")
        return data

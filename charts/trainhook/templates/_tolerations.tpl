{{/*
The namespaces whose training pods get the chart's `tolerations` (webhook/admission/tolerations.py, docs/operate/security.md), as the
webhook's TRAINHOOK_WEBHOOK_TOLERATION_NAMESPACES. Tolerations without a namespace would reach no pod: refused, so
an upgrade from the chart that gave them to every labeled pod says so instead of silently dropping them.
*/}}
{{- define "trainhook.tolerationNamespaces" -}}
{{- if and .Values.tolerations (not .Values.tolerationNamespaces) }}
{{- fail "tolerations are set but tolerationNamespaces is empty, so no pod would get them: name the namespaces whose training pods may use the tainted nodes (tolerationNamespaces: [team-a]), or [\"*\"] for every namespace the webhook serves (docs/operate/helm.md, docs/operate/security.md)" }}
{{- end }}
{{- join "," (.Values.tolerationNamespaces | default list) }}
{{- end }}

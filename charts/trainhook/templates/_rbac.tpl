{{/*
Whether the ValidatingAdmissionPolicy that limits the webhook's own writes is installed (value rbac.admissionPolicy,
docs/operate/security.md): "true" or "". auto asks the API server (helm install and upgrade see what it serves;
`helm template` sees only what --api-versions names).
*/}}
{{- define "trainhook.admissionPolicy" -}}
{{- $want := .Values.rbac.admissionPolicy -}}
{{- if eq (toString $want) "auto" -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" -}}true{{- end -}}
{{- else if $want -}}true{{- end -}}
{{- end }}

{{/* The uninstall check's own ServiceAccount: it may list pods and nothing else. */}}
{{- define "trainhook.uninstallCheckServiceAccountName" -}}
{{- printf "%s-uninstall-check" (include "trainhook.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The webhook's ServiceAccount as RBAC subjects. */}}
{{- define "trainhook.webhookSubjects" -}}
- kind: ServiceAccount
  name: {{ include "trainhook.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end }}

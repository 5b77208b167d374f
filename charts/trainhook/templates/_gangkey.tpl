{{/*
The Secret holding the gang key: gangKey.existingSecret (yours), else "<fullname>-gang-key", which the webhook
creates at its first start and keeps (templates/gang-key.yaml grants that and nothing more).
*/}}
{{- define "trainhook.gangKeySecretName" -}}
{{- default (printf "%s-gang-key" (include "trainhook.fullname" .)) .Values.gangKey.existingSecret }}
{{- end }}

{{/*
Names. Kubernetes names are limited to 63 characters for some fields (DNS labels), so trim.
*/}}
{{- define "trainhook.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "trainhook.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "trainhook.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Standard labels (https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/).
*/}}
{{- define "trainhook.baseLabels" -}}
helm.sh/chart: {{ include "trainhook.chart" . }}
app.kubernetes.io/name: {{ include "trainhook.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: trainhook
{{- end }}

{{/* The webhook's objects. */}}
{{- define "trainhook.labels" -}}
{{ include "trainhook.baseLabels" . }}
app.kubernetes.io/component: webhook
{{- end }}

{{/*
Selector labels: stable across upgrades (a Deployment's selector is immutable), so no version here.
*/}}
{{- define "trainhook.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainhook.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end }}

{{- define "trainhook.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "trainhook.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false: name an existing ServiceAccount in the release namespace" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The MutatingWebhookConfiguration (cluster-scoped) and the Service it calls. */}}
{{- define "trainhook.webhookConfigName" -}}
{{- include "trainhook.fullname" . }}
{{- end }}

{{- define "trainhook.serviceName" -}}
{{- include "trainhook.fullname" . }}
{{- end }}

{{/*
The certificate mode, checked (the schema checks it too; this keeps templates honest if the schema is skipped).
*/}}
{{- define "trainhook.certMode" -}}
{{- $mode := .Values.certificates.mode }}
{{- if not (has $mode (list "self-managed" "cert-manager" "secret")) }}
{{- fail (printf "certificates.mode must be one of self-managed, cert-manager, secret; got %q" $mode) }}
{{- end }}
{{- $mode }}
{{- end }}

{{/* The TLS Secret the webhook serves from: required in mode `secret`, "<fullname>-tls" by default otherwise. */}}
{{- define "trainhook.tlsSecretName" -}}
{{- if eq (include "trainhook.certMode" .) "secret" }}
{{- required "certificates.secretName is required with certificates.mode=secret: name the kubernetes.io/tls Secret (keys tls.crt, tls.key) in the release namespace that the webhook serves" .Values.certificates.secretName }}
{{- else }}
{{- default (printf "%s-tls" (include "trainhook.fullname" .)) .Values.certificates.secretName }}
{{- end }}
{{- end }}

{{/* Mode `secret`: the caBundle, base64 of the PEM CA; accepts PEM text or its base64. */}}
{{- define "trainhook.caBundle" -}}
{{- $ca := required "certificates.caBundle is required with certificates.mode=secret: give the PEM CA certificate that signed the Secret's tls.crt (PEM text or its base64)" .Values.certificates.caBundle | trim }}
{{- $b64 := $ca }}
{{- if hasPrefix "-----BEGIN" $ca }}
{{- $b64 = printf "%s\n" $ca | b64enc }}
{{- else }}
{{- $b64 = $ca | nospace }}
{{- end }}
{{- if not (hasPrefix "-----BEGIN CERTIFICATE-----" (b64dec $b64)) }}
{{- fail "certificates.caBundle is neither a PEM certificate (-----BEGIN CERTIFICATE-----) nor the base64 of one" }}
{{- end }}
{{- $b64 }}
{{- end }}

{{/* cert-manager mode: the serving Certificate, and the issuer that signs it. */}}
{{- define "trainhook.certificateName" -}}
{{- include "trainhook.fullname" . }}
{{- end }}

{{- define "trainhook.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "trainhook.launcherImage" -}}
{{- printf "%s:%s" .Values.launcherImage.repository (default .Chart.AppVersion .Values.launcherImage.tag) }}
{{- end }}

{{/* The DNS names the serving certificate must carry: how the API server reaches the Service. */}}
{{- define "trainhook.serviceDNSNames" -}}
{{- $svc := include "trainhook.serviceName" . }}
- {{ $svc }}
- {{ $svc }}.{{ .Release.Namespace }}
- {{ $svc }}.{{ .Release.Namespace }}.svc
- {{ $svc }}.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}
{{- end }}

{{/*
What both webhooks of the MutatingWebhookConfiguration share: fail closed, but only for objects that opted in
(objectSelector), and never in kube-system or the release's own namespace (so the webhook can always restart).
*/}}
{{- define "trainhook.webhookCommon" -}}
admissionReviewVersions: ["v1"]
sideEffects: None
matchPolicy: Equivalent
reinvocationPolicy: IfNeeded
timeoutSeconds: {{ .Values.timeoutSeconds }}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        {{- toYaml (concat (list "kube-system" .Release.Namespace) .Values.excludeNamespaces | uniq) | nindent 8 }}
    {{- with .Values.rbac.gangNamespaces }}
    {{- /* rbac.gangNamespaces: the notary may act only there (notary-rbac.yaml), so gangs are wired only there. */}}
    - key: kubernetes.io/metadata.name
      operator: In
      values:
        {{- toYaml . | nindent 8 }}
    {{- end }}
clientConfig:
  service:
    name: {{ include "trainhook.serviceName" . }}
    namespace: {{ .Release.Namespace }}
    path: /mutate
    port: 443
  {{- if eq (include "trainhook.certMode" .) "secret" }}
  caBundle: {{ include "trainhook.caBundle" . }}
  {{- end }}
{{- end }}

{{/*
The PodDisruptionBudget's API version: the one the cluster serves. policy/v1 when the cluster lists
policy/v1/PodDisruptionBudget (helm install and upgrade ask the cluster: 1.21 and later), policy/v1beta1 when it
lists only that (1.20). Without a cluster (helm template, lint), where no kind is listed, by Kubernetes version:
policy/v1 from 1.21 (--kube-version picks it).
*/}}
{{- define "trainhook.pdbApiVersion" -}}
{{- if .Capabilities.APIVersions.Has "policy/v1/PodDisruptionBudget" -}}
policy/v1
{{- else if .Capabilities.APIVersions.Has "policy/v1beta1/PodDisruptionBudget" -}}
policy/v1beta1
{{- else if semverCompare ">=1.21.0-0" .Capabilities.KubeVersion.Version -}}
policy/v1
{{- else -}}
policy/v1beta1
{{- end -}}
{{- end }}

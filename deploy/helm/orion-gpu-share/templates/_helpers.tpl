{{/* Names and labels shared by all templates of orion-gpu-share. */}}

{{- define "orion.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "orion.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "orion.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "orion.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "orion.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "orion.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: orion-gpu-share
{{- end }}

{{/* Selector labels of one component: node (server + agent) or webhook. */}}
{{- define "orion.selectorLabels" -}}
app.kubernetes.io/name: {{ include "orion.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "orion.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "orion.webhookName" -}}
{{ include "orion.fullname" . }}-webhook
{{- end }}

{{- define "orion.webhookTlsSecret" -}}
{{- if eq .Values.webhook.tls.mode "secret" }}
{{- required "webhook.tls.existingSecret is required when webhook.tls.mode=secret" .Values.webhook.tls.existingSecret }}
{{- else }}
{{- include "orion.webhookName" . }}-tls
{{- end }}
{{- end }}

{{/* Name of the Secret holding the admin API tokens. */}}
{{- define "orion.adminTokensSecret" -}}
{{- .Values.server.adminAuth.existingSecret | default (printf "%s-admin-tokens" (include "orion.fullname" .)) -}}
{{- end -}}

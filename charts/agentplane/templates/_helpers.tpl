{{- define "agentplane.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "agentplane.labels" -}}
app.kubernetes.io/name: agentplane-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "agentplane.selector" -}}
app.kubernetes.io/name: agentplane-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "agentplane.webhookService" -}}
{{ include "agentplane.fullname" . }}-webhook
{{- end -}}

{{- define "agentplane.tlsSecret" -}}
{{ include "agentplane.fullname" . }}-webhook-tls
{{- end -}}

{{- define "agentplane.gateway" -}}
{{ include "agentplane.fullname" . }}-gateway
{{- end -}}

{{- define "agentplane.gatewaySelector" -}}
app.kubernetes.io/name: agentplane-gateway
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "agentplane.gatewayLabels" -}}
{{ include "agentplane.gatewaySelector" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "agentplane.dispatcher" -}}
{{ include "agentplane.fullname" . }}-dispatcher
{{- end -}}

{{- define "agentplane.dispatcherSelector" -}}
app.kubernetes.io/name: agentplane-dispatcher
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "agentplane.dispatcherLabels" -}}
{{ include "agentplane.dispatcherSelector" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

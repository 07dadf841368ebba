{{/* Names and labels shared by every template. */}}

{{- define "sentinel.fullname" -}}
{{- if contains "sentinel" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-sentinel" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sentinel.labels" -}}
app.kubernetes.io/name: sentinel
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "sentinel.selector" -}}
app.kubernetes.io/name: sentinel
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sentinel.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "sentinel.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{ .Values.serviceAccount.name | default (include "sentinel.fullname" .) }}
{{- else -}}
{{ .Values.serviceAccount.name | default "default" }}
{{- end -}}
{{- end -}}

{{/* Every server by its stable name, comma-separated: the failover list agents and launchers take. */}}
{{- define "sentinel.serverList" -}}
{{- $name := printf "%s-server" (include "sentinel.fullname" .) -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.server.replicas) -}}
{{- $urls = append $urls (printf "http://%s-%d.%s.%s.svc:%d" $name $i $name $.Release.Namespace (int $.Values.server.port)) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}

{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "thetaserve.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-qualified name: the release name alone when it already contains the chart name. */}}
{{- define "thetaserve.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "thetaserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "thetaserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "thetaserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "thetaserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: server
{{- end -}}

{{- define "thetaserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Seconds from the deletion of a pod to SIGKILL: preStop sleep, drain, gRPC shutdown + margin. */}}
{{- define "thetaserve.terminationGracePeriod" -}}
{{- add .Values.drain.preStopSleepSeconds .Values.drain.timeoutSeconds 15 -}}
{{- end -}}

{{/* The chart name. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every object name. */}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ include "sluice.chart" . }}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sluice
{{- end }}

{{/* Selector labels of one component: include with (dict "ctx" . "component" "controller"). */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "sluice.controller.fullname" -}}
{{- printf "%s-controller" (include "sluice.fullname" .) }}
{{- end }}

{{- define "sluice.dataplane.fullname" -}}
{{- printf "%s-dataplane" (include "sluice.fullname" .) }}
{{- end }}

{{- define "sluice.controller.serviceAccountName" -}}
{{- if .Values.serviceAccount.controller.create }}
{{- default (include "sluice.controller.fullname" .) .Values.serviceAccount.controller.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.controller.name }}
{{- end }}
{{- end }}

{{- define "sluice.dataplane.serviceAccountName" -}}
{{- if .Values.serviceAccount.dataplane.create }}
{{- default (include "sluice.dataplane.fullname" .) .Values.serviceAccount.dataplane.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.dataplane.name }}
{{- end }}
{{- end }}

{{- define "sluice.controller.tlsSecret" -}}
{{- default (printf "%s-tls" (include "sluice.controller.fullname" .)) .Values.snapshotTLS.controllerSecretName }}
{{- end }}

{{- define "sluice.dataplane.tlsSecret" -}}
{{- default (printf "%s-tls" (include "sluice.dataplane.fullname" .)) .Values.snapshotTLS.dataplaneSecretName }}
{{- end }}

{{/* The names the controller's gRPC certificate is valid for (its Service's DNS names). */}}
{{- define "sluice.controller.dnsNames" -}}
{{- $svc := include "sluice.controller.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson }}
{{- end }}

{{- define "sluice.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* nodeSelector of a component: the arch pin plus the component's own selector. */}}
{{- define "sluice.nodeSelector" -}}
{{- $sel := deepCopy (.values.nodeSelector | default dict) -}}
{{- if .ctx.Values.arch }}
{{- $_ := set $sel "kubernetes.io/arch" .ctx.Values.arch -}}
{{- end }}
{{- if $sel }}
nodeSelector:
  {{- toYaml $sel | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The chart name, overridable with nameOverride.
*/}}
{{- define "agentrun.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object name: fullnameOverride, or the release name when it already contains the
chart name, or "<release>-<chart>". Cluster-scoped objects (ClusterRoles, ClusterRoleBindings) carry
it too, so two releases never collide.
*/}}
{{- define "agentrun.fullname" -}}
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

{{/*
"<chart>-<version>" for the helm.sh/chart label.
*/}}
{{- define "agentrun.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object the chart creates. `app.kubernetes.io/instance` finds them all.
*/}}
{{- define "agentrun.labels" -}}
helm.sh/chart: {{ include "agentrun.chart" . }}
{{ include "agentrun.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: agentrun
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels of the controller Pods (stable across upgrades: never add to them).
*/}}
{{- define "agentrun.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentrun.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of the controller's objects (selector labels plus the component).
*/}}
{{- define "agentrun.controllerSelectorLabels" -}}
{{ include "agentrun.selectorLabels" . }}
app.kubernetes.io/component: controller
{{- end }}

{{/*
The controller's object names.
*/}}
{{- define "agentrun.controllerName" -}}
{{- printf "%s-controller" (include "agentrun.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The controller's service account: the created one, or the one named in serviceAccount.name.
*/}}
{{- define "agentrun.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "agentrun.controllerName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The controller image reference: repository with tag (default: the chart's appVersion) or digest.
*/}}
{{- define "agentrun.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The worker image: workerImage, or the controller image (one image holds both commands).
*/}}
{{- define "agentrun.workerImage" -}}
{{- default (include "agentrun.image" .) .Values.workerImage }}
{{- end }}

{{/*
The metrics/health listen address passed to --metrics-addr.
*/}}
{{- define "agentrun.metricsAddr" -}}
{{- printf "0.0.0.0:%d" (int .Values.metrics.port) }}
{{- end }}

{{/*
RBAC subjects from a {groups, users, serviceAccounts} block of values.
*/}}
{{- define "agentrun.subjects" -}}
{{- range .groups }}
- apiGroup: rbac.authorization.k8s.io
  kind: Group
  name: {{ . | quote }}
{{- end }}
{{- range .users }}
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: {{ . | quote }}
{{- end }}
{{- range .serviceAccounts }}
- kind: ServiceAccount
  name: {{ .name | quote }}
  namespace: {{ .namespace | quote }}
{{- end }}
{{- end }}

{{/* Chart name, cut at 63 characters (a DNS label). */}}
{{- define "autorl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart> unless the release name holds the chart name; 63 characters at most. */}}
{{- define "autorl.fullname" -}}
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

{{/* A component's name: <fullname>-<component>, with room for the suffix. */}}
{{- define "autorl.componentName" -}}
{{- printf "%s-%s" (include "autorl.fullname" .root | trunc (int (sub 62 (len .component))) | trimSuffix "-") .component }}
{{- end }}

{{- define "autorl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select a component's pods; never change them on upgrade. */}}
{{- define "autorl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "autorl.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Every object's labels. */}}
{{- define "autorl.labels" -}}
helm.sh/chart: {{ include "autorl.chart" .root }}
{{ include "autorl.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}

{{/* An AutoRL image: registry/repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "autorl.image" -}}
{{- $tag := .image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- printf "%s/%s:%s" .root.Values.image.registry .image.repository $tag }}
{{- end }}

{{/* A third-party image (bundled Postgres and Redis), entirely from values. */}}
{{- define "autorl.externalImage" -}}
{{- printf "%s/%s:%s" .registry .repository .tag }}
{{- end }}

{{- define "autorl.imagePullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* Names of the Secrets and the claim, bundled or existing. */}}
{{- define "autorl.adminSecretName" -}}
{{- .Values.adminToken.existingSecret | default (include "autorl.componentName" (dict "root" . "component" "admin-token")) }}
{{- end }}

{{- define "autorl.adminSecretKey" -}}
{{- if .Values.adminToken.existingSecret }}{{ .Values.adminToken.existingSecretKey }}{{ else }}admin-token{{ end }}
{{- end }}

{{- define "autorl.databaseSecretName" -}}
{{- if .Values.postgresql.enabled }}{{ include "autorl.componentName" (dict "root" . "component" "postgres") }}{{ else }}{{ required "postgresql.external.existingSecret is required when postgresql.enabled is false" .Values.postgresql.external.existingSecret }}{{ end }}
{{- end }}

{{- define "autorl.databaseSecretKey" -}}
{{- if .Values.postgresql.enabled }}database-url{{ else }}{{ .Values.postgresql.external.existingSecretKey }}{{ end }}
{{- end }}

{{- define "autorl.redisSecretName" -}}
{{- if .Values.redis.enabled }}{{ include "autorl.componentName" (dict "root" . "component" "redis") }}{{ else }}{{ required "redis.external.existingSecret is required when redis.enabled is false" .Values.redis.external.existingSecret }}{{ end }}
{{- end }}

{{- define "autorl.redisSecretKey" -}}
{{- if .Values.redis.enabled }}redis-url{{ else }}{{ .Values.redis.external.existingSecretKey }}{{ end }}
{{- end }}

{{- define "autorl.sharedClaimName" -}}
{{- .Values.shared.existingClaim | default (include "autorl.componentName" (dict "root" . "component" "shared")) }}
{{- end }}

{{- define "autorl.graderUrl" -}}
{{- printf "http://%s.%s.svc:%v" (include "autorl.componentName" (dict "root" . "component" "grader")) .Release.Namespace .Values.grader.service.port }}
{{- end }}

{{/* Namespaces the controller runs Experiments in. */}}
{{- define "autorl.watchNamespaces" -}}
{{- if .Values.controller.watchNamespaces }}{{ join "," .Values.controller.watchNamespaces }}{{ else }}{{ .Release.Namespace }}{{ end }}
{{- end }}

{{/* Pod Security "restricted" for a container of the chart. */}}
{{- define "autorl.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The connection settings every AutoRL service reads (AUTORL_*), from Secrets. */}}
{{- define "autorl.connectionEnv" -}}
- name: AUTORL_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "autorl.databaseSecretName" . }}
      key: {{ include "autorl.databaseSecretKey" . }}
- name: AUTORL_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "autorl.redisSecretName" . }}
      key: {{ include "autorl.redisSecretKey" . }}
- name: AUTORL_REDIS_KEY_PREFIX
  value: {{ include "autorl.fullname" . | quote }}
- name: AUTORL_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "autorl.adminSecretName" . }}
      key: {{ include "autorl.adminSecretKey" . }}
- name: AUTORL_HOME
  value: /tmp/autorl
- name: AUTORL_CACHE_DIR
  value: {{ printf "%s/cache" .Values.shared.mountPath | quote }}
{{- end }}

{{/* A Secret value that survives upgrades: the live one if the release has it, else a new random one. */}}
{{- define "autorl.persistentRandom" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .name }}
{{- if and $existing (hasKey $existing.data .key) }}
{{- index $existing.data .key | b64dec }}
{{- else }}
{{- randAlphaNum 40 }}
{{- end }}
{{- end }}

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

{{/* Every Secret the platform's own pods read: an Experiment's agent may never take one by envFrom. */}}
{{- define "autorl.platformSecrets" -}}
{{- $names := list (include "autorl.adminSecretName" .) -}}
{{- $names = append $names (ternary (include "autorl.postgresAuthSecretName" .) .Values.postgresql.external.existingSecret .Values.postgresql.enabled) -}}
{{- $names = append $names (ternary (include "autorl.redisAuthSecretName" .) .Values.redis.external.existingSecret .Values.redis.enabled) -}}
{{- $names = append $names .Values.controller.prepareEnvSecret -}}
{{- $names = append $names .Values.evaluator.testData.hubTokenSecret -}}
{{- $names = concat $names .Values.image.pullSecrets -}}
{{- join "," (compact (uniq $names)) -}}
{{- end }}

{{/* The bundled Postgres's password: an existing Secret or the generated one. */}}
{{- define "autorl.postgresAuthSecretName" -}}
{{- .Values.postgresql.auth.existingSecret | default (include "autorl.componentName" (dict "root" . "component" "postgres")) }}
{{- end }}

{{- define "autorl.postgresAuthSecretKey" -}}
{{- if .Values.postgresql.auth.existingSecret }}{{ .Values.postgresql.auth.existingSecretKey }}{{ else }}password{{ end }}
{{- end }}

{{/* The bundled Redis's password: an existing Secret or the generated one. */}}
{{- define "autorl.redisAuthSecretName" -}}
{{- .Values.redis.auth.existingSecret | default (include "autorl.componentName" (dict "root" . "component" "redis")) }}
{{- end }}

{{- define "autorl.redisAuthSecretKey" -}}
{{- if .Values.redis.auth.existingSecret }}{{ .Values.redis.auth.existingSecretKey }}{{ else }}password{{ end }}
{{- end }}

{{- define "autorl.sharedClaimName" -}}
{{- .Values.shared.existingClaim | default (include "autorl.componentName" (dict "root" . "component" "shared")) }}
{{- end }}

{{- define "autorl.snapshotClaimName" -}}
{{- .Values.snapshots.existingClaim | default (include "autorl.componentName" (dict "root" . "component" "snapshots")) }}
{{- end }}

{{/* The grader's agent API, the URL agents are given. */}}
{{- define "autorl.graderUrl" -}}
{{- printf "http://%s.%s.svc:%v" (include "autorl.componentName" (dict "root" . "component" "grader")) .Release.Namespace .Values.grader.service.port }}
{{- end }}

{{/* The grader's admin API, for the controller. */}}
{{- define "autorl.graderAdminUrl" -}}
{{- printf "http://%s.%s.svc:%v" (include "autorl.componentName" (dict "root" . "component" "grader")) .Release.Namespace .Values.grader.service.adminPort }}
{{- end }}

{{/* Selects this release's own pods of the given components: the only peers of Postgres, Redis and the admin port. */}}
{{- define "autorl.platformPeer" -}}
podSelector:
  matchLabels:
    app.kubernetes.io/name: {{ include "autorl.name" .root }}
    app.kubernetes.io/instance: {{ .root.Release.Name }}
  matchExpressions:
    - key: app.kubernetes.io/component
      operator: In
      values: {{ toJson .components }}
{{- end }}

{{/* The platform's pod security context: its own user and group; fsGroup makes fresh claims writable
(checked at the root only: a full snapshot volume is not walked at every start). */}}
{{- define "autorl.platformPodSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.platform.uid }}
runAsGroup: {{ .Values.platform.gid }}
fsGroup: {{ .Values.platform.gid }}
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
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

{{/* The connection settings every AutoRL service reads (AUTORL_*), from Secrets. Bundled stores:
the URL is composed from the password by Kubernetes' $(VAR) expansion, so it always carries one. */}}
{{- define "autorl.connectionEnv" -}}
{{- if .Values.postgresql.enabled }}
- name: POSTGRES_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "autorl.postgresAuthSecretName" . }}
      key: {{ include "autorl.postgresAuthSecretKey" . }}
- name: AUTORL_DATABASE_URL
  value: {{ printf "postgresql+psycopg://%s:$(POSTGRES_PASSWORD)@%s:5432/%s" .Values.postgresql.username (include "autorl.componentName" (dict "root" . "component" "postgres")) .Values.postgresql.database | quote }}
{{- else }}
- name: AUTORL_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "postgresql.external.existingSecret is required when postgresql.enabled is false" .Values.postgresql.external.existingSecret }}
      key: {{ .Values.postgresql.external.existingSecretKey }}
{{- end }}
{{- if .Values.redis.enabled }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "autorl.redisAuthSecretName" . }}
      key: {{ include "autorl.redisAuthSecretKey" . }}
- name: AUTORL_REDIS_URL
  value: {{ printf "redis://:$(REDIS_PASSWORD)@%s:6379/0" (include "autorl.componentName" (dict "root" . "component" "redis")) | quote }}
{{- else }}
- name: AUTORL_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "redis.external.existingSecret is required when redis.enabled is false" .Values.redis.external.existingSecret }}
      key: {{ .Values.redis.external.existingSecretKey }}
{{- end }}
- name: AUTORL_REDIS_KEY_PREFIX
  value: {{ include "autorl.fullname" . | quote }}
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

{{/* The evaluation settings. The grader records them with each experiment and the workers obey the
recorded config, so both get the same values from evaluator.*; the grader's timeout also sets the
queue's job timeout. */}}
{{- define "autorl.evaluationEnv" -}}
- name: AUTORL_EVAL_BACKEND
  value: {{ .Values.evaluator.backend | quote }}
- name: AUTORL_EVAL_TIMEOUT_S
  value: {{ .Values.evaluator.timeoutSeconds | quote }}
{{- if .Values.evaluator.maxNewTokens }}
- name: AUTORL_EVAL_MAX_NEW_TOKENS
  value: {{ .Values.evaluator.maxNewTokens | quote }}
{{- end }}
{{- if .Values.evaluator.batchSize }}
- name: AUTORL_EVAL_BATCH_SIZE
  value: {{ .Values.evaluator.batchSize | quote }}
{{- end }}
{{- end }}

{{/* Where the data step mounts evaluator.testData.existingClaim. */}}
{{- define "autorl.testDataSourceMount" -}}
/var/lib/autorl-test-data-source
{{- end }}

{{/* The data step's command: `autorl test-data` for each task, from the configured source. */}}
{{- define "autorl.testDataCommand" -}}
{{- $data := .Values.evaluator.testData }}
{{- if not $data.tasks }}
{{- fail "evaluator.testData.tasks must name at least one task (e.g. [gsm8k])" }}
{{- end }}
- autorl
- test-data
{{- range $data.tasks }}
- --task
- {{ . | quote }}
{{- end }}
{{- if eq $data.source "url" }}
- --source-url
- {{ required "evaluator.testData.url is required when evaluator.testData.source is url" $data.url | quote }}
{{- end }}
{{- end }}

{{/* The data step's environment: hub access (and token) only for the hub source, a source folder
only for the folder source. */}}
{{- define "autorl.testDataEnv" -}}
{{- $data := .Values.evaluator.testData }}
{{- $claims := list (include "autorl.sharedClaimName" .) (include "autorl.snapshotClaimName" .) }}
{{- if and $data.existingClaim (has $data.existingClaim $claims) }}
{{- fail (printf "evaluator.testData.existingClaim %q is the shared or snapshot claim, which other pods mount: give the test data a claim of its own" $data.existingClaim) }}
{{- end }}
- name: AUTORL_HOME
  value: /tmp/autorl
- name: AUTORL_EVAL_DIR
  value: /var/lib/autorl-eval
- name: HOME
  value: /tmp
{{- if eq $data.source "hub" }}
- name: HF_HOME
  value: /tmp/huggingface
- name: HF_HUB_OFFLINE
  value: "0"
- name: HF_DATASETS_OFFLINE
  value: "0"
{{- with $data.hubTokenSecret }}
- name: HF_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $data.hubTokenSecretKey }}
{{- end }}
{{- else if eq $data.source "folder" }}
- name: AUTORL_DATA_SOURCE_DIR
  {{- if $data.existingClaim }}
  value: {{ printf "%s/%s" (include "autorl.testDataSourceMount" .) (trimPrefix "/" $data.folder) | trimSuffix "/" | quote }}
  {{- else }}
  value: {{ required "evaluator.testData.folder is required when evaluator.testData.source is folder" $data.folder | quote }}
  {{- end }}
{{- end }}
{{- end }}

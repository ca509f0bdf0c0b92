{{/*
Names, labels and images.
*/}}
{{- define "baton.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "baton.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The name of one component's resources: `<fullname>-<component>`. Call with (dict "root" $ "component" "gateway"). */}}
{{- define "baton.componentName" -}}
{{- printf "%s-%s" (include "baton.fullname" .root | trunc 40 | trimSuffix "-") .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "baton.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of one component. Call with (dict "root" $ "component" "gateway"). */}}
{{- define "baton.selectorLabels" -}}
app.kubernetes.io/name: {{ include "baton.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end -}}

{{/* Every label of one component's resources. Call with (dict "root" $ "component" "gateway"). */}}
{{- define "baton.labels" -}}
helm.sh/chart: {{ include "baton.chart" .root }}
{{ include "baton.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: baton
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* An image reference; a digest wins over a tag. Call with (dict "root" $ "image" .Values.image). */}}
{{- define "baton.image" -}}
{{- $repo := .image.repository -}}
{{- if .image.registry -}}
{{- $repo = printf "%s/%s" .image.registry .image.repository -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repo .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "baton.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "baton.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
Deep merge of `over` onto `base`, returned as JSON. Sprig's merge treats false and 0 as unset,
which would make `autoscaling.enabled: false` or `minReplicaCount: 0` in an executor entry vanish.
*/}}
{{- define "baton.mergeValues" -}}
{{- $out := deepCopy .base -}}
{{- range $k, $v := .over -}}
{{- $cur := get $out $k -}}
{{- if and (kindIs "map" $v) (kindIs "map" $cur) -}}
{{- $_ := set $out $k (include "baton.mergeValues" (dict "base" $cur "over" $v) | fromJson) -}}
{{- else -}}
{{- $_ := set $out $k $v -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* A provider as it may appear in a resource name (openai_compatible -> openai-compatible). */}}
{{- define "baton.providerSlug" -}}
{{- . | replace "_" "-" | lower -}}
{{- end -}}

{{/* Where the configuration file is mounted in every pod. */}}
{{- define "baton.configDir" -}}/etc/baton{{- end -}}
{{- define "baton.configPath" -}}/etc/baton/baton.yaml{{- end -}}

{{/* The configuration file's text; pods roll when its checksum changes (the services read it at start). */}}
{{- define "baton.configData" -}}
{{- toYaml .Values.config -}}
{{- end -}}

{{- define "baton.kafkaProtocol" -}}
{{- default "PLAINTEXT" .Values.config.kafka.security_protocol -}}
{{- end -}}

{{- define "baton.kafkaUsesSasl" -}}
{{- if hasPrefix "SASL_" (include "baton.kafkaProtocol" .) -}}true{{- end -}}
{{- end -}}

{{- define "baton.kafkaUsesTls" -}}
{{- if has (include "baton.kafkaProtocol" .) (list "SSL" "SASL_SSL") -}}true{{- end -}}
{{- end -}}

{{/* The brokers' CA from kafka.tls.caSecret is mounted as the file config.kafka.ssl_cafile. */}}
{{- define "baton.kafkaMountsCa" -}}
{{- if and (include "baton.kafkaUsesTls" .) .Values.kafka.tls.caSecret -}}true{{- end -}}
{{- end -}}

{{/*
Container env every Baton service shares: the config path, the SASL password and OTEL_* wiring.
The services name themselves (OTEL_SERVICE_NAME is left to the code). Call with (dict "root" $).
*/}}
{{- define "baton.commonEnv" -}}
{{- $root := .root -}}
{{- $user := include "baton.kafkaUser" . -}}
- name: BATON_CONFIG
  value: {{ include "baton.configPath" $root | quote }}
{{- if and $user (include "baton.kafkaUsesSasl" $root) }}
- name: BATON_KAFKA__SASL_USERNAME
  value: {{ $user | quote }}
- name: {{ $root.Values.config.kafka.sasl_password_env }}
  valueFrom:
    secretKeyRef:
      name: {{ $user | quote }}
      key: password
{{- else if include "baton.kafkaUsesSasl" $root }}
- name: {{ $root.Values.config.kafka.sasl_password_env }}
  valueFrom:
    secretKeyRef:
      name: {{ $root.Values.kafka.sasl.existingSecret | quote }}
      key: {{ $root.Values.kafka.sasl.existingSecretPasswordKey | quote }}
{{- end }}
{{- if and $user (eq $root.Values.kafka.users.authentication "tls") }}
- name: BATON_KAFKA__SSL_CERTFILE
  value: {{ printf "%s/user.crt" (include "baton.kafkaUserDir" .) | quote }}
- name: BATON_KAFKA__SSL_KEYFILE
  value: {{ printf "%s/user.key" (include "baton.kafkaUserDir" .) | quote }}
{{- end }}
{{- if $root.Values.otel.enabled }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ required "otel.endpoint is required when otel.enabled is true" $root.Values.otel.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $root.Values.otel.protocol | quote }}
{{- $attrs := list "k8s.namespace.name=$(POD_NAMESPACE)" "k8s.pod.name=$(POD_NAME)" "k8s.node.name=$(NODE_NAME)" (printf "service.namespace=%s" $root.Release.Name) }}
{{- range $k, $v := $root.Values.otel.resourceAttributes }}
{{- $attrs = append $attrs (printf "%s=%v" $k $v) }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $attrs | quote }}
{{- with $root.Values.otel.sampler }}
- name: OTEL_TRACES_SAMPLER
  value: {{ . | quote }}
{{- end }}
{{- with $root.Values.otel.samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ . | quote }}
{{- end }}
{{- if $root.Values.otel.headers.existingSecret }}
- name: OTEL_EXPORTER_OTLP_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ $root.Values.otel.headers.existingSecret | quote }}
      key: {{ $root.Values.otel.headers.existingSecretKey | quote }}
{{- end }}
{{- else }}
- name: OTEL_TRACES_EXPORTER
  value: "none"
{{- end }}
{{- end -}}

{{/*
The Kafka user a service's pod connects as with kafka.users.enabled (baton_platform.acls.identity:
`baton-<service>`), else nothing. Call with (dict "root" $ "service" NAME); without a service (the
topics Job) it is config.kafka's own user.
*/}}
{{- define "baton.kafkaUser" -}}
{{- if and .root.Values.kafka.users.enabled .service -}}baton-{{ .service | replace "_" "-" }}{{- end -}}
{{- end -}}

{{- define "baton.kafkaUserDir" -}}/etc/baton-kafka-user{{- end -}}

{{/* Volumes every Baton pod mounts: the configuration, /tmp, the Kafka CA, and with kafka.users over
mutual TLS its user's certificate. Call with (dict "root" $ "configMap" NAME "service" NAME). */}}
{{- define "baton.commonVolumes" -}}
- name: config
  configMap:
    name: {{ .configMap | default (include "baton.fullname" .root) }}
- name: tmp
  emptyDir:
    sizeLimit: {{ .root.Values.tmpDir.sizeLimit }}
{{- if include "baton.kafkaMountsCa" .root }}
- name: kafka-ca
  secret:
    secretName: {{ .root.Values.kafka.tls.caSecret | quote }}
    items:
      - key: {{ .root.Values.kafka.tls.caSecretKey | quote }}
        path: ca.crt
{{- end }}
{{- if and (include "baton.kafkaUser" .) (eq .root.Values.kafka.users.authentication "tls") }}
- name: kafka-user
  secret:
    secretName: {{ include "baton.kafkaUser" . | quote }}
    items:
      - {key: user.crt, path: user.crt}
      - {key: user.key, path: user.key}
{{- end }}
{{- end -}}

{{/* Call with (dict "root" $ "service" NAME), as baton.commonVolumes. */}}
{{- define "baton.commonVolumeMounts" -}}
- name: config
  mountPath: {{ include "baton.configDir" .root }}
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if include "baton.kafkaMountsCa" .root }}
- name: kafka-ca
  mountPath: {{ .root.Values.config.kafka.ssl_cafile }}
  subPath: ca.crt
  readOnly: true
{{- end }}
{{- if and (include "baton.kafkaUser" .) (eq .root.Values.kafka.users.authentication "tls") }}
- name: kafka-user
  mountPath: {{ include "baton.kafkaUserDir" .root }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* Liveness and readiness probes on the health endpoints. Call with (dict "live" .livenessProbe "ready" .readinessProbe). */}}
{{- define "baton.probes" -}}
{{- with .live }}
{{- if .enabled }}
livenessProbe:
  httpGet:
    path: /health/live
    port: http
  initialDelaySeconds: {{ .initialDelaySeconds }}
  periodSeconds: {{ .periodSeconds }}
  timeoutSeconds: {{ .timeoutSeconds }}
  failureThreshold: {{ .failureThreshold }}
{{- end }}
{{- end }}
{{- with .ready }}
{{- if .enabled }}
readinessProbe:
  httpGet:
    path: /health/ready
    port: http
  initialDelaySeconds: {{ .initialDelaySeconds }}
  periodSeconds: {{ .periodSeconds }}
  timeoutSeconds: {{ .timeoutSeconds }}
  failureThreshold: {{ .failureThreshold }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Scheduling fields of a pod spec. Call with the component's values. */}}
{{- define "baton.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* A PodDisruptionBudget spec body. Call with (dict "pdb" .pdb "root" $ "component" NAME). */}}
{{/*
A PodDisruptionBudget's spec. A Deployment that runs one pod (no autoscaler, replicaCount 1) gets
minAvailable 1, not maxUnavailable 1 (which lets a node drain take its only pod): a drain then waits
until a second pod runs, which a rollout's surge pod or a scale-up gives. Call with (dict "pdb" PDB
"root" $ "component" NAME "single" BOOL).
*/}}
{{- define "baton.pdbSpec" -}}
{{- if hasKey .pdb "minAvailable" }}
minAvailable: {{ .pdb.minAvailable }}
{{- else if .single }}
minAvailable: 1
{{- else }}
maxUnavailable: {{ .pdb.maxUnavailable }}
{{- end }}
selector:
  matchLabels:
    {{- include "baton.selectorLabels" (dict "root" .root "component" .component) | nindent 4 }}
{{- end -}}

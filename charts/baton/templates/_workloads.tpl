{{/*
The services, one Deployment, Service and PodDisruptionBudget each (deployment.yaml, service.yaml,
pdb.yaml, hpa.yaml), as JSON {"items": [...]}: gateway, router, synthesizer, reward logger, the
console when enabled, then one executor per provider of config.workers. Each item is the component's values (an executor's are
executorDefaults with its `executors` entry merged over them) plus:
  kind        the values key; `baton.<kind>.pod` renders what its pod adds to the common one
  component   app.kubernetes.io/component, and the suffix of its resources' names
  name, command, port (config.<section>.port), labels (extra, on every resource of it)
  identity    the name of its Kafka identity, `baton-<service>` (baton.kafkaUser)
  metricsPort the gateway's config.gateway.metrics_port, where it serves /metrics (0 elsewhere: the
              others serve /metrics on `port`)
  hpa         a CPU HorizontalPodAutoscaler is rendered; autoscaled: replicas are left to an autoscaler
  maxReplicas the most replicas it may run, checked against config.kafka.partitions
*/}}
{{- define "baton.workloads" -}}
{{- $v := .Values -}}
{{- $items := list -}}
{{- range $s := list (list "gateway" "gateway" "gateway") (list "router" "router" "router") (list "synthesizer" "synthesizer" "synthesizer") (list "rewardLogger" "reward-logger" "reward_logger") -}}
{{- $w := deepCopy (get $v (index $s 0)) -}}
{{- $_ := merge $w (dict "kind" (index $s 0) "component" (index $s 1) "container" (index $s 1) "section" (index $s 2) "identity" (index $s 1) "labels" dict) -}}
{{- $items = append $items $w -}}
{{- end -}}
{{- if $v.console.enabled -}}
{{- $w := deepCopy $v.console -}}
{{- $_ := merge $w (dict "kind" "console" "component" "console" "container" "console" "section" "console" "identity" "console" "labels" dict) -}}
{{- $items = append $items $w -}}
{{- end -}}
{{- range $p := include "baton.providers" . | fromJsonArray -}}
{{- $w := include "baton.mergeValues" (dict "base" $v.executorDefaults "over" (get $v.executors $p | default dict)) | fromJson -}}
{{- $component := printf "executor-%s" (include "baton.providerSlug" $p) -}}
{{- $_ := merge $w (dict "kind" "executor" "component" $component "container" "executor" "section" "executor" "provider" $p "identity" (printf "executor-%s" $p) "labels" (dict "baton.dev/provider" $p)) -}}
{{- $items = append $items $w -}}
{{- end -}}
{{- range $w := $items -}}
{{- $_ := set $w "name" (include "baton.componentName" (dict "root" $ "component" $w.component)) -}}
{{- $_ := set $w "command" (printf "baton-%s" $w.container) -}}
{{- $_ := set $w "port" (required (printf "config.%s.port is required: the chart serves it" $w.section) (get (get $v.config $w.section | default dict) "port")) -}}
{{- $_ := set $w "metricsPort" 0 -}}
{{- if eq $w.kind "gateway" -}}
{{- $_ := set $w "metricsPort" (required "config.gateway.metrics_port is required: the chart serves the gateway's /metrics there" $v.config.gateway.metrics_port) -}}
{{- end -}}
{{- $keda := and (eq $w.kind "executor") $v.keda.enabled -}}
{{- $hpa := and (dig "autoscaling" "enabled" false $w) (not $keda) -}}
{{- $_ := set $w "hpa" $hpa -}}
{{- $_ := set $w "autoscaled" (or $hpa $keda) -}}
{{- $most := $w.replicaCount -}}
{{- if $keda }}{{ $most = $w.keda.maxReplicaCount }}{{ else if $hpa }}{{ $most = $w.autoscaling.maxReplicas }}{{ end -}}
{{- $_ := set $w "maxReplicas" (int $most) -}}
{{- end -}}
{{- toJson (dict "items" $items) -}}
{{- end -}}

{{/* The providers of config.workers, sorted, as a JSON list. */}}
{{- define "baton.providers" -}}
{{- $providers := dict -}}
{{- range .Values.config.workers }}{{ $_ := set $providers .provider true }}{{ end -}}
{{- keys $providers | sortAlpha | toJson -}}
{{- end -}}

{{/* A Secret-filled variable per entry of `[{env, existingSecret, existingSecretKey}]`. */}}
{{- define "baton.secretEnv" -}}
{{- range . }}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret | quote }}
      key: {{ .existingSecretKey | quote }}
{{- end }}
{{- end -}}

{{/*
What one kind of pod adds to the common one, as YAML with any of: strategy, image,
imagePullPolicy, args, env, startupProbe, resources, tolerations, volumeMounts, volumes, annotations
(of the Deployment). Called with (dict "root" $ "w" ITEM).
*/}}
{{- define "baton.gateway.pod" -}}
{{- $c := .root.Values.config.gateway -}}
{{- if ne (default "keys" $c.auth) "none" }}
env:
  {{- include "baton.secretEnv" (list (dict "env" (default "BATON_API_KEYS" $c.keys_env) "existingSecret" .w.auth.existingSecret "existingSecretKey" .w.auth.existingSecretKey)) | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "baton.synthesizer.pod" -}}
{{- end -}}

{{/*
The console reads the episode volume, read-only, and the gateway's key hashes (admin keys); it reads
the gateway's refusals from console.prometheusUrl, else (unless config.console names a source) from
the /metrics of the gateway Service's `metrics` port.
*/}}
{{- define "baton.console.pod" -}}
{{- $root := .root -}}
{{- $c := $root.Values.config.gateway -}}
{{- $cc := $root.Values.config.console | default dict -}}
{{- $mount := include "baton.rewardLogger.datasetMount" $root -}}
env:
  {{- if ne (default "keys" $c.auth) "none" }}
  {{- include "baton.secretEnv" (list (dict "env" (default "BATON_API_KEYS" $c.keys_env) "existingSecret" $root.Values.gateway.auth.existingSecret "existingSecretKey" $root.Values.gateway.auth.existingSecretKey)) | nindent 2 }}
  {{- end }}
  {{- if $root.Values.console.prometheusUrl }}
  - name: BATON_CONSOLE__PROMETHEUS_URL
    value: {{ $root.Values.console.prometheusUrl | quote }}
  {{- else if not (or $cc.prometheus_url $cc.gateway_metrics_url) }}
  - name: BATON_CONSOLE__GATEWAY_METRICS_URL
    value: {{ printf "http://%s.%s.svc:%v/metrics" (include "baton.componentName" (dict "root" $root "component" "gateway")) $root.Release.Namespace $c.metrics_port | quote }}
  {{- end }}
{{- if $mount }}
volumeMounts:
  - name: episodes
    mountPath: {{ $mount }}
    readOnly: true
volumes:
  {{- include "baton.rewardLogger.datasetVolume" (dict "root" $root "readOnly" true) | nindent 2 }}
{{- end }}
{{- end -}}

{{/* One Deployment per provider: its own topic baton.tasks.<provider> and consumer group baton-executor-<provider>. */}}
{{- define "baton.executor.pod" -}}
{{- $root := .root -}}
{{- $e := .w -}}
annotations:
  # What this executor reads; the topic's partition count is the ceiling on its replicas.
  baton.dev/tasks-topic: {{ printf "baton.tasks.%s" $e.provider | quote }}
  baton.dev/consumer-group: {{ printf "baton-executor-%s" $e.provider | quote }}
args:
  - --provider
  - {{ $e.provider | quote }}
env:
  {{- if and (include "baton.kafkaUsesSasl" $root) $root.Values.keda.enabled }}
  # KEDA's Kafka scaler reads the SASL user name from here (TriggerAuthentication env).
  - name: BATON_KAFKA__SASL_USERNAME
    value: {{ $root.Values.config.kafka.sasl_username | quote }}
  {{- end }}
  {{- include "baton.secretEnv" $e.apiKeys | nindent 2 }}
{{- end -}}

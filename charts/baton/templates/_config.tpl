{{/*
The one configuration file every service reads (BATON_CONFIG), rendered from values.
The code rejects unknown keys, so only fields the code defines are written, in its snake_case.
*/}}

{{/* The executor settings of each provider, as JSON {provider: executor}. */}}
{{- define "baton.executorsByProvider" -}}
{{- $by := dict -}}
{{- range (include "baton.executors" . | fromJson).items -}}
{{- $_ := set $by .provider . -}}
{{- end -}}
{{- toJson $by -}}
{{- end -}}

{{/* The environment variable a worker's key is read from, or nothing. Call with (dict "worker" W "executor" E). */}}
{{- define "baton.workerApiKeyEnv" -}}
{{- if .worker.apiKeyEnv -}}
{{- .worker.apiKeyEnv -}}
{{- else if and .executor .executor.apiKey.existingSecret -}}
{{- .executor.apiKey.env -}}
{{- end -}}
{{- end -}}

{{/*
A values section as the code's snake_case mapping. Unset settings (null, "" or {}) are left out so
the application's defaults apply; false and 0 are kept. Nested maps (adapter names) keep their keys.
*/}}
{{- define "baton.snakeSection" -}}
{{- $out := dict -}}
{{- range $k, $v := .values -}}
{{- if not (or (kindIs "invalid" $v) (and (kindIs "string" $v) (eq $v "")) (and (kindIs "map" $v) (empty $v))) -}}
{{- $_ := set $out (snakecase $k) $v -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{- define "baton.plan" -}}
{{- dict "workers" .workers "subtasks" .subtasks "access" .access | toJson -}}
{{- end -}}

{{- define "baton.configData" -}}
{{- $v := .Values -}}
{{- $executors := include "baton.executorsByProvider" . | fromJson -}}
{{- $workers := list -}}
{{- range $w := $v.workers -}}
{{- $out := dict "name" $w.name "provider" $w.provider "model" $w.model -}}
{{- with $w.baseUrl }}{{ $_ := set $out "base_url" . }}{{ end -}}
{{- $keyEnv := include "baton.workerApiKeyEnv" (dict "worker" $w "executor" (get $executors $w.provider)) -}}
{{- with $keyEnv }}{{ $_ := set $out "api_key_env" . }}{{ end -}}
{{- with $w.limits -}}
{{- $limits := dict -}}
{{- if hasKey . "rpm" }}{{ $_ := set $limits "rpm" .rpm }}{{ end -}}
{{- if hasKey . "tpm" }}{{ $_ := set $limits "tpm" .tpm }}{{ end -}}
{{- if hasKey . "concurrency" }}{{ $_ := set $limits "concurrency" .concurrency }}{{ end -}}
{{- $_ := set $out "limits" $limits -}}
{{- end -}}
{{- with $w.price -}}
{{- $price := dict -}}
{{- if hasKey . "inputPerMtok" }}{{ $_ := set $price "input_per_mtok" .inputPerMtok }}{{ end -}}
{{- if hasKey . "outputPerMtok" }}{{ $_ := set $price "output_per_mtok" .outputPerMtok }}{{ end -}}
{{- $_ := set $out "price" $price -}}
{{- end -}}
{{- with $w.card }}{{ $_ := set $out "card" . }}{{ end -}}
{{- with $w.fallback }}{{ $_ := set $out "fallback" . }}{{ end -}}
{{- with $w.sim -}}
{{- $sim := dict "dataset" .dataset -}}
{{- with .column }}{{ $_ := set $sim "column" . }}{{ end -}}
{{- if hasKey . "latencyMs" }}{{ $_ := set $sim "latency_ms" .latencyMs }}{{ end -}}
{{- $_ := set $out "sim" $sim -}}
{{- end -}}
{{- $workers = append $workers $out -}}
{{- end -}}

{{- $r := $v.router -}}
{{- $c := $r.conductor -}}
{{- $conductor := dict "backend" $c.backend "max_steps" $c.maxSteps -}}
{{- with $c.plan }}{{ $_ := set $conductor "plan" (include "baton.plan" . | fromJson) }}{{ end -}}
{{- with $c.fallbackPlan }}{{ $_ := set $conductor "fallback_plan" (include "baton.plan" . | fromJson) }}{{ end -}}
{{- with $c.innerPlan }}{{ $_ := set $conductor "inner_plan" (include "baton.plan" . | fromJson) }}{{ end -}}
{{- $_ := mergeOverwrite $conductor (include "baton.snakeSection" (dict "values" (pick $c "maxSubtaskChars" "maxQueryChars" "promptExample" "maxDepth")) | fromJson) -}}
{{- if has $c.backend (list "vllm" "transformers" "policy") -}}
{{- $_ := set $conductor $c.backend (include "baton.snakeSection" (dict "values" (get $r $c.backend)) | fromJson) -}}
{{- else if eq $c.backend "openai" -}}
{{- $oa := include "baton.snakeSection" (dict "values" (omit $r.openai "apiKey")) | fromJson -}}
{{- if $r.openai.apiKey.existingSecret }}{{ $_ := set $oa "api_key_env" $r.openai.apiKey.env }}{{ end -}}
{{- $_ := set $conductor "openai" $oa -}}
{{- end -}}

{{- $k := $v.kafka -}}
{{- $kafka := dict "bootstrap_servers" $k.bootstrapServers "security_protocol" $k.securityProtocol "partitions" $k.partitions "replication_factor" $k.replicationFactor -}}
{{- if include "baton.kafkaUsesSasl" . -}}
{{- $_ := set $kafka "sasl_mechanism" $k.sasl.mechanism -}}
{{- $_ := set $kafka "sasl_username" $k.sasl.username -}}
{{- $_ := set $kafka "sasl_password_env" (include "baton.saslPasswordEnv" .) -}}
{{- end -}}
{{- if and (include "baton.kafkaUsesTls" .) $k.tls.caSecret -}}
{{- $_ := set $kafka "ssl_cafile" (printf "%s/ca.crt" (include "baton.kafkaCaDir" .)) -}}
{{- end -}}
{{- if not (kindIs "invalid" $k.sessionTimeoutMs) }}{{ $_ := set $kafka "session_timeout_ms" $k.sessionTimeoutMs }}{{ end -}}
{{- if not (kindIs "invalid" $k.heartbeatIntervalMs) }}{{ $_ := set $kafka "heartbeat_interval_ms" $k.heartbeatIntervalMs }}{{ end -}}
{{- if not (kindIs "invalid" $k.lingerMs) }}{{ $_ := set $kafka "linger_ms" $k.lingerMs }}{{ end -}}

{{- $g := $v.gateway -}}
{{- $gateway := dict "host" "0.0.0.0" "port" $g.containerPort "request_timeout_s" $g.config.requestTimeoutS "max_body_bytes" $g.config.maxBodyBytes "max_messages" $g.config.maxMessages -}}
{{- if $g.auth.enabled -}}
{{- $_ := set $gateway "auth" "keys" -}}
{{- else -}}
{{- /* Only behind the operator's own authenticating proxy (values say so by turning auth off). */ -}}
{{- $_ := set $gateway "auth" "none" -}}
{{- $_ := set $gateway "allow_unauthenticated_network" true -}}
{{- end -}}
{{- $tenants := list -}}
{{- range $t := $g.tenants -}}
{{- $tenants = append $tenants (include "baton.snakeSection" (dict "values" $t) | fromJson) -}}
{{- end -}}
{{- $router := dict "host" "0.0.0.0" "port" $r.containerPort "explore_share" $r.exploration.share "explore_group_size" $r.exploration.groupSize -}}
{{- $synthesizer := dict "host" "0.0.0.0" "port" $v.synthesizer.containerPort "step_timeout_s" $v.synthesizer.config.stepTimeoutS "group_answer" $v.synthesizer.config.groupAnswer -}}
{{- $executor := dict "host" "0.0.0.0" "port" $v.executorDefaults.containerPort "max_attempts" $v.executorDefaults.maxAttempts -}}
{{- $rl := $v.rewardLogger -}}
{{- $rewardLogger := dict "host" "0.0.0.0" "port" $rl.containerPort "dataset_dir" $rl.dataset.mountPath "flush_every" $rl.config.flushEvery "flush_interval_s" $rl.config.flushIntervalS -}}
{{- $evalSets := dict -}}
{{- range $name, $set := $rl.evalSets.sets -}}
{{- /* Absolute paths: a relative one would resolve against the config file's folder, not the sets'. */ -}}
{{- $entry := dict "path" (include "baton.rewardLogger.evalSetPath" (dict "root" $ "set" $set)) -}}
{{- with $set.grader }}{{ $_ := set $entry "grader" . }}{{ end -}}
{{- $_ := set $evalSets $name $entry -}}
{{- end -}}
{{- if $evalSets }}{{ $_ := set $rewardLogger "eval_sets" $evalSets }}{{ end -}}

{{- $config := dict "workers" $workers "conductor" $conductor "kafka" $kafka "gateway" $gateway "router" $router "synthesizer" $synthesizer "executor" $executor "reward_logger" $rewardLogger "tenants" $tenants -}}
{{- with $v.judge.worker }}{{ $_ := set $config "judge" (include "baton.snakeSection" (dict "values" $v.judge) | fromJson) }}{{ end -}}
{{- toYaml $config -}}
{{- end -}}

{{/*
Checks the schema cannot express. Each failure says what is wrong and which value fixes it.
*/}}
{{- define "baton.validate" -}}
{{- $v := .Values -}}
{{- $partitions := int $v.kafka.partitions -}}
{{- $executors := (include "baton.executors" . | fromJson).items -}}
{{- $byProvider := include "baton.executorsByProvider" . | fromJson -}}
{{- if ne (len $executors) (len (keys $byProvider)) -}}
{{- fail "executors: each provider may appear only once (one Deployment per provider)" -}}
{{- end -}}
{{- $workerProviders := dict -}}
{{- range $w := $v.workers -}}
{{- $_ := set $workerProviders $w.provider true -}}
{{- $e := get $byProvider $w.provider -}}
{{- if not $e -}}
{{- fail (printf "worker %q uses provider %q but no entry of `executors` serves it; add `- provider: %s`" $w.name $w.provider $w.provider) -}}
{{- end -}}
{{- $keyEnv := include "baton.workerApiKeyEnv" (dict "worker" $w "executor" $e) -}}
{{- if and (not $keyEnv) (has $w.provider (list "openai" "anthropic" "gemini")) -}}
{{- fail (printf "worker %q (provider %s) needs an API key: set executors[provider=%s].apiKey.existingSecret or the worker's apiKeyEnv" $w.name $w.provider $w.provider) -}}
{{- end -}}
{{- if $keyEnv -}}
{{- $provided := list -}}
{{- if $e.apiKey.existingSecret }}{{ $provided = append $provided $e.apiKey.env }}{{ end -}}
{{- range $e.extraApiKeys }}{{ $provided = append $provided .env }}{{ end -}}
{{- if not (has $keyEnv $provided) -}}
{{- fail (printf "worker %q reads its key from %s, but executor %s sets no such variable: add it to that executor's apiKey or extraApiKeys" $w.name $keyEnv $w.provider) -}}
{{- end -}}
{{- end -}}
{{- if and (eq $w.provider "sim") (not $w.sim) -}}
{{- fail (printf "worker %q: provider sim needs `sim: {dataset: <path in the pod>}`" $w.name) -}}
{{- end -}}
{{- if and (eq $w.provider "openai_compatible") (not $w.baseUrl) -}}
{{- fail (printf "worker %q: provider openai_compatible needs a baseUrl" $w.name) -}}
{{- end -}}
{{- end -}}
{{- range $e := $executors -}}
{{- if not (hasKey $workerProviders $e.provider) -}}
{{- fail (printf "executor %s serves no worker (an executor exits when none of its provider is configured); remove it or add a worker" $e.provider) -}}
{{- end -}}
{{- if and $e.apiKey.existingSecret (not $e.apiKey.env) -}}
{{- fail (printf "executor %s: apiKey.env must name the variable the key is set in" $e.provider) -}}
{{- end -}}
{{- $most := int $e.replicaCount -}}
{{- if $v.keda.enabled -}}
{{- $most = int $e.keda.maxReplicaCount -}}
{{- else if $e.autoscaling.enabled -}}
{{- $most = int $e.autoscaling.maxReplicas -}}
{{- end -}}
{{- if gt $most $partitions -}}
{{- fail (printf "executor %s may run %d replicas but baton.tasks.%s has kafka.partitions=%d: replicas beyond the partition count stay idle; raise kafka.partitions or lower the maximum" $e.provider $most $e.provider $partitions) -}}
{{- end -}}
{{- end -}}
{{- $gatewayMost := int $v.gateway.replicaCount -}}
{{- if $v.gateway.autoscaling.enabled }}{{ $gatewayMost = int $v.gateway.autoscaling.maxReplicas }}{{ end -}}
{{- range $name, $n := dict "gateway" $gatewayMost "router" (int $v.router.replicaCount) "synthesizer" (int $v.synthesizer.replicaCount) "rewardLogger" (int $v.rewardLogger.replicaCount) -}}
{{- if gt $n $partitions -}}
{{- fail (printf "%s may run %d replicas but kafka.partitions is %d: the extra replicas get no partition" $name $n $partitions) -}}
{{- end -}}
{{- end -}}
{{- $c := $v.router.conductor -}}
{{- if and (eq $c.backend "vllm") (not $v.router.gpu.enabled) -}}
{{- fail "router.conductor.backend vllm needs router.gpu.enabled=true; on clusters without GPUs use the transformers, policy, openai or static backend" -}}
{{- end -}}
{{- if and (eq $v.synthesizer.config.groupAnswer "judge") (not $v.judge.worker) -}}
{{- fail "synthesizer.config.groupAnswer judge needs judge.worker (the worker that scores the candidates)" -}}
{{- end -}}
{{- if and (eq $c.backend "static") (not $c.plan) -}}
{{- fail "router.conductor.backend static needs router.conductor.plan {workers, subtasks, access}" -}}
{{- end -}}
{{- if and (eq $c.backend "openai") (or (not $v.router.openai.baseUrl) (not $v.router.openai.model)) -}}
{{- fail "router.conductor.backend openai needs router.openai.baseUrl and router.openai.model" -}}
{{- end -}}
{{- if include "baton.kafkaUsesSasl" . -}}
{{- if or (not $v.kafka.sasl.username) (not $v.kafka.sasl.existingSecret) -}}
{{- fail (printf "kafka.securityProtocol %s needs kafka.sasl.username and kafka.sasl.existingSecret (the Secret with the password)" $v.kafka.securityProtocol) -}}
{{- end -}}
{{- end -}}
{{- if and $v.gateway.auth.enabled (not $v.gateway.auth.existingSecret) -}}
{{- fail "gateway.auth.enabled needs gateway.auth.existingSecret: a Secret whose key gateway.auth.existingSecretKey holds the key entries `tenant:sha256[:scope+scope]` (`baton keys create --tenant NAME` prints one)" -}}
{{- end -}}
{{- $rl := $v.rewardLogger -}}
{{- $mounted := list -}}
{{- if $rl.evalSets.configMap }}{{ $mounted = append $mounted $rl.evalSets.mountPath }}{{ end -}}
{{- range $rl.extraVolumeMounts }}{{ $mounted = append $mounted .mountPath }}{{ end -}}
{{- range $name, $set := $rl.evalSets.sets -}}
{{- if and (not (isAbs $set.path)) (not $rl.evalSets.configMap) -}}
{{- fail (printf "rewardLogger.evalSets.sets.%s.path %q is relative to rewardLogger.evalSets.mountPath, where rewardLogger.evalSets.configMap is mounted: set configMap, or give an absolute path on a volume of rewardLogger.extraVolumeMounts" $name $set.path) -}}
{{- end -}}
{{- $path := include "baton.rewardLogger.evalSetPath" (dict "root" $ "set" $set) -}}
{{- $found := false -}}
{{- range $m := $mounted }}{{ if hasPrefix (printf "%s/" (trimSuffix "/" $m)) $path }}{{ $found = true }}{{ end }}{{ end -}}
{{- if not $found -}}
{{- fail (printf "rewardLogger.evalSets.sets.%s.path %s is on no volume of the reward logger: mount it with rewardLogger.evalSets.configMap or rewardLogger.extraVolumes and extraVolumeMounts (the reward logger would not start without the file)" $name $path) -}}
{{- end -}}
{{- end -}}
{{- if and $v.gateway.auth.enabled (not $v.gateway.tenants) -}}
{{- fail "gateway.auth.enabled needs at least one entry in gateway.tenants: every key belongs to a tenant" -}}
{{- end -}}
{{- end -}}

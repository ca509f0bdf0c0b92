{{/*
What the deployment needs of the configuration, and the schema cannot express. The configuration's
own rules (a static plan, the judge, worker references) are the services' to check: they refuse a
configuration that breaks them at start. Each failure says what is wrong and which value fixes it.
*/}}
{{- define "baton.validate" -}}
{{- $v := .Values -}}
{{- $c := $v.config -}}
{{- $partitions := int $c.kafka.partitions -}}
{{- $workloads := (include "baton.workloads" . | fromJson).items -}}
{{- range $w := $workloads -}}
{{- if gt (int $w.maxReplicas) $partitions -}}
{{- fail (printf "%s may run %d replicas but config.kafka.partitions is %d: replicas beyond the partition count get no partition; raise config.kafka.partitions or lower the maximum" $w.component (int $w.maxReplicas) $partitions) -}}
{{- end -}}
{{- $host := get (get $c $w.section) "host" | default "127.0.0.1" -}}
{{- if not (has $host (list "0.0.0.0" "::")) -}}
{{- fail (printf "config.%s.host %s is not reachable from outside the pod (probes, Service): use 0.0.0.0" $w.section $host) -}}
{{- end -}}
{{- if eq $w.kind "executor" -}}
{{- $keys := list -}}
{{- range $w.apiKeys }}{{ $keys = append $keys .env }}{{ end -}}
{{- range $worker := $c.workers -}}
{{- if eq $worker.provider $w.provider -}}
{{- if $worker.api_key_env -}}
{{- if not (has $worker.api_key_env $keys) -}}
{{- fail (printf "worker %q reads its key from %s, but executors.%s.apiKeys sets no such variable: add {env: %s, existingSecret: ..., existingSecretKey: ...}" $worker.name $worker.api_key_env $w.provider $worker.api_key_env) -}}
{{- end -}}
{{- else if has $worker.provider (list "openai" "anthropic" "gemini") -}}
{{- fail (printf "worker %q (provider %s) needs an API key: set its api_key_env and list that variable in executors.%s.apiKeys" $worker.name $worker.provider $worker.provider) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (eq (default "static" $c.conductor.backend) "vllm") (not $v.router.gpu.enabled) -}}
{{- fail "config.conductor.backend vllm needs router.gpu.enabled=true; on clusters without GPUs use the transformers, policy, openai or static backend" -}}
{{- end -}}
{{- if and $v.router.conductorApiKey.existingSecret (not (dig "openai" "api_key_env" "" $c.conductor)) -}}
{{- fail "router.conductorApiKey.existingSecret needs config.conductor.openai.api_key_env: the variable the key is set in" -}}
{{- end -}}
{{- if include "baton.kafkaUsesSasl" . -}}
{{- if or (not $c.kafka.sasl_username) (not $c.kafka.sasl_password_env) (not $v.kafka.sasl.existingSecret) -}}
{{- fail (printf "config.kafka.security_protocol %s needs config.kafka.sasl_username, config.kafka.sasl_password_env (the variable the password is set in) and kafka.sasl.existingSecret (the Secret with the password)" (include "baton.kafkaProtocol" .)) -}}
{{- end -}}
{{- end -}}
{{- if and (include "baton.kafkaMountsCa" .) (not (isAbs (toString (default "" $c.kafka.ssl_cafile)))) -}}
{{- fail "kafka.tls.caSecret needs config.kafka.ssl_cafile: the absolute path the certificate is mounted at, e.g. /etc/baton-kafka/ca.crt" -}}
{{- end -}}
{{- if ne (default "keys" $c.gateway.auth) "none" -}}
{{- if not $v.gateway.auth.existingSecret -}}
{{- fail "config.gateway.auth keys needs gateway.auth.existingSecret: a Secret whose key gateway.auth.existingSecretKey holds the key entries `tenant:sha256[:scope+scope]` (`baton keys create --tenant NAME` prints one)" -}}
{{- end -}}
{{- if not $c.tenants -}}
{{- fail "config.gateway.auth keys needs at least one entry in config.tenants: every key belongs to a tenant" -}}
{{- end -}}
{{- end -}}
{{- $dataset := toString $c.reward_logger.dataset_dir -}}
{{- if not (or (contains "://" $dataset) (isAbs $dataset)) -}}
{{- fail (printf "config.reward_logger.dataset_dir %q must be an absolute path (where the episode volume is mounted) or an fsspec URL" $dataset) -}}
{{- end -}}
{{- $rl := $v.rewardLogger -}}
{{- $mounted := list -}}
{{- if $rl.evalSets.configMap }}{{ $mounted = append $mounted $rl.evalSets.mountPath }}{{ end -}}
{{- range $rl.extraVolumeMounts }}{{ $mounted = append $mounted .mountPath }}{{ end -}}
{{- range $name, $set := $c.reward_logger.eval_sets -}}
{{- $path := include "baton.rewardLogger.evalSetPath" $set -}}
{{- $found := false -}}
{{- range $m := $mounted }}{{ if hasPrefix (printf "%s/" (trimSuffix "/" $m)) $path }}{{ $found = true }}{{ end }}{{ end -}}
{{- if not $found -}}
{{- fail (printf "config.reward_logger.eval_sets.%s: %s is on no volume of the reward logger (relative paths are relative to %s): mount it with rewardLogger.evalSets.configMap (at rewardLogger.evalSets.mountPath) or rewardLogger.extraVolumes and extraVolumeMounts (the reward logger would not start without the file)" $name $path (include "baton.configDir" $)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The suite's topics and partition counts, as JSON {"items": [{name, partitions, config}]}. It mirrors
baton_platform.topics.topic_plan: every topic gets config.kafka.partitions and a week's retention,
except baton.policy (one compacted partition), baton.rewards (one partition), baton.responses (kept at
least as long as idempotency keys), baton.stored-responses (compacted, deleted after
config.gateway.stored_responses_days), baton.idempotency (kept config.gateway.idempotency_hours),
baton.spend (one compacted partition), baton.batches (one partition, compacted and deleted as
stored responses) and baton.limits.<provider> (one compacted partition); one baton.tasks.<provider> per provider in use.
With three replicas or more every topic sets min.insync.replicas=2.
*/}}
{{- define "baton.topics" -}}
{{- $n := int .Values.config.kafka.partitions -}}
{{- $gateway := .Values.config.gateway | default dict -}}
{{- $weekMs := 604800000 -}}
{{- $week := printf "%d" $weekMs -}}
{{- $hoursMs := int64 (mulf ($gateway.idempotency_hours | default 24) 3600000) -}}
{{- $items := list -}}
{{- range $name := list "baton.requests" "baton.workflow" "baton.feedback" "baton.dlq" -}}
{{- $items = append $items (dict "name" $name "partitions" $n "config" (dict "retention.ms" $week)) -}}
{{- end -}}
{{- $items = append $items (dict "name" "baton.responses" "partitions" $n "config" (dict "retention.ms" (printf "%d" (max $weekMs $hoursMs)))) -}}
{{- $items = append $items (dict "name" "baton.policy" "partitions" 1 "config" (dict "cleanup.policy" "compact")) -}}
{{- $items = append $items (dict "name" "baton.rewards" "partitions" 1 "config" (dict "retention.ms" $week)) -}}
{{- $stored := dict "cleanup.policy" "compact,delete" "retention.ms" (printf "%d" (int64 (mulf ($gateway.stored_responses_days | default 30) 86400000))) -}}
{{- $items = append $items (dict "name" "baton.stored-responses" "partitions" $n "config" $stored) -}}
{{- $items = append $items (dict "name" "baton.idempotency" "partitions" $n "config" (dict "retention.ms" (printf "%d" $hoursMs))) -}}
{{- $items = append $items (dict "name" "baton.spend" "partitions" 1 "config" (dict "cleanup.policy" "compact")) -}}
{{- $items = append $items (dict "name" "baton.batches" "partitions" 1 "config" $stored) -}}
{{- range $p := include "baton.providers" . | fromJsonArray -}}
{{- $items = append $items (dict "name" (printf "baton.tasks.%s" $p) "partitions" $n "config" (dict "retention.ms" $week)) -}}
{{- $items = append $items (dict "name" (printf "baton.limits.%s" $p) "partitions" 1 "config" (dict "cleanup.policy" "compact" "segment.ms" "60000")) -}}
{{- end -}}
{{- if ge (int .Values.config.kafka.replication_factor) 3 -}}
{{- range $t := $items -}}
{{- $_ := set $t.config "min.insync.replicas" "2" -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "items" $items) -}}
{{- end -}}

{{- define "baton.topics.jobEnabled" -}}
{{- if and .Values.topics.job.enabled (not .Values.topics.strimzi.enabled) -}}true{{- end -}}
{{- end -}}

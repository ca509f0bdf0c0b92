{{/*
The suite's topics and partition counts, as JSON {"items": [{name, partitions, config}]}. It mirrors
baton_platform.topics.topic_plan: every topic gets config.kafka.partitions, baton.policy one compacted
partition, baton.rewards one partition kept a week, baton.stored-responses compacted and deleted after
config.gateway.stored_responses_days, baton.idempotency kept config.gateway.idempotency_hours, and there is one baton.tasks.<provider> per provider in use.
*/}}
{{- define "baton.topics" -}}
{{- $n := int .Values.config.kafka.partitions -}}
{{- $items := list -}}
{{- range $name := list "baton.requests" "baton.workflow" "baton.responses" "baton.feedback" "baton.dlq" -}}
{{- $items = append $items (dict "name" $name "partitions" $n "config" dict) -}}
{{- end -}}
{{- $items = append $items (dict "name" "baton.policy" "partitions" 1 "config" (dict "cleanup.policy" "compact")) -}}
{{- $items = append $items (dict "name" "baton.rewards" "partitions" 1 "config" (dict "retention.ms" "604800000")) -}}
{{- $days := ((.Values.config.gateway | default dict).stored_responses_days | default 30) -}}
{{- $stored := dict "cleanup.policy" "compact,delete" "retention.ms" (printf "%d" (int64 (mulf $days 86400000))) -}}
{{- $items = append $items (dict "name" "baton.stored-responses" "partitions" $n "config" $stored) -}}
{{- $hours := ((.Values.config.gateway | default dict).idempotency_hours | default 24) -}}
{{- $items = append $items (dict "name" "baton.idempotency" "partitions" $n "config" (dict "retention.ms" (printf "%d" (int64 (mulf $hours 3600000))))) -}}
{{- range $p := include "baton.providers" . | fromJsonArray -}}
{{- $items = append $items (dict "name" (printf "baton.tasks.%s" $p) "partitions" $n "config" dict) -}}
{{- $items = append $items (dict "name" (printf "baton.limits.%s" $p) "partitions" 1 "config" (dict "cleanup.policy" "compact" "segment.ms" "60000")) -}}
{{- end -}}
{{- toJson (dict "items" $items) -}}
{{- end -}}

{{- define "baton.topics.jobEnabled" -}}
{{- if and .Values.topics.job.enabled (not .Values.topics.strimzi.enabled) -}}true{{- end -}}
{{- end -}}

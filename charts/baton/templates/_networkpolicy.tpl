{{/* Egress rules when networkPolicy.restrictEgress is on: DNS, Kafka, the collector and HTTPS. */}}
{{- define "baton.networkPolicy.egress" -}}
{{- $n := .Values.networkPolicy -}}
- ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
- ports:
    {{- range $n.kafkaPorts }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
  {{- with $n.kafkaPeers }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- if .Values.otel.enabled }}
- ports:
    - port: 4317
      protocol: TCP
    - port: 4318
      protocol: TCP
{{- end }}
# Provider APIs (executors), model downloads (router) and object storage are HTTPS.
- ports:
    - port: 443
      protocol: TCP
{{- with $n.extraEgress }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Egress rules of every Baton pod when networkPolicy.restrictEgress is on: DNS, Kafka and the collector,
then networkPolicy.extraEgress. No HTTPS: only the executors reach the internet, on 443, by a policy of
their own (networkpolicy-executors.yaml); anything else a pod must reach (a remote conductor, an object
store, Prometheus) is an extraEgress rule.
*/}}
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
{{- with $n.extraEgress }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The router image: the GPU image with a GPU, else router.image, else the services image. */}}
{{- define "baton.router.image" -}}
{{- $r := .Values.router -}}
{{- if $r.gpu.enabled -}}
{{- include "baton.image" (dict "root" . "image" $r.gpu.image) -}}
{{- else if $r.image.repository -}}
{{- include "baton.image" (dict "root" . "image" $r.image) -}}
{{- else -}}
{{- include "baton.image" (dict "root" . "image" .Values.image) -}}
{{- end -}}
{{- end -}}

{{- define "baton.router.pullPolicy" -}}
{{- if .Values.router.gpu.enabled -}}
{{- .Values.router.gpu.image.pullPolicy -}}
{{- else -}}
{{- .Values.image.pullPolicy -}}
{{- end -}}
{{- end -}}

{{- define "baton.router.modelClaim" -}}
{{- default (include "baton.componentName" (dict "root" . "component" "models")) .Values.router.modelStorage.existingClaim -}}
{{- end -}}
